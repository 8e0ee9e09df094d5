// CudaBackend: device memory, copies and the stream; each op family is in the file of its name.
#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/base/bytes.h"
#include "kernels/base/status.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/step_graph.cuh"

namespace moe::kernels {

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const BackendOptions& options) {
  int count = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess || count == 0) {
    cudaGetLastError();  // not sticky; clear it
    return absl::FailedPreconditionError(
        absl::StrCat("cuda backend: no usable CUDA device (", cudaGetErrorName(err), ": ",
                     cudaGetErrorString(err), ", ", count, " devices)"));
  }
  MOE_CUDA_CHECK(cudaSetDevice(0));
  int num_sms = 0, major = 0;
  MOE_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  MOE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  const char* env = std::getenv("MOE_CUDA_PDL");
  const std::string pdl = env != nullptr ? env : "";
  const OverlapLaunches overlap = major < 9 || pdl == "0" ? OverlapLaunches::kNever
                                  : pdl == "1"           ? OverlapLaunches::kAlways
                                                         : OverlapLaunches::kSmallSteps;
  const char* graphs = std::getenv("MOE_CUDA_GRAPHS");
  cudaStream_t stream = nullptr;
  MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return std::unique_ptr<CudaBackend>(new CudaBackend(
      stream, num_sms, overlap, graphs == nullptr || std::string(graphs) != "0"));
}

CudaBackend::CudaBackend(CUstream_st* stream, int num_sms, OverlapLaunches overlap, bool graphs)
    : stream_(stream),
      num_sms_(num_sms),
      overlap_(overlap),
      graphs_(std::make_unique<cuda::StepGraphs>(stream)),
      use_graphs_(graphs) {
  MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  MOE_CUDA_CHECK(cudaEventCreateWithFlags(&host_copies_done_, cudaEventDisableTiming));
  for (CUevent_st*& e : copy_done_) {
    MOE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  for (CUevent_st*& e : compute_marks_) {
    MOE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  if (const char* tokens = std::getenv("MOE_CUDA_GRAPH_TOKENS"); tokens != nullptr) {
    graph_max_tokens_ = std::max(0L, std::strtol(tokens, nullptr, 10));
  }
  if (const char* split = std::getenv("MOE_GEMM_SPLITK"); split != nullptr) {
    split_k_ = std::string(split) != "0";
  }
  if (const char* chunk = std::getenv("MOE_ROUTED_CHUNK"); chunk != nullptr) {
    routed_chunk_override_ = std::max(0L, std::strtol(chunk, nullptr, 10));
  }
  if (const char* split = std::getenv("MOE_GEMM_SPLIT"); split != nullptr) {
    split_gemm_ = std::string(split) != "0";
  }
}

CudaBackend::~CudaBackend() {
  graphs_->Stop();
  cudaStreamSynchronize(copy_stream_);
  cudaStreamDestroy(copy_stream_);
  cudaEventDestroy(host_copies_done_);
  for (CUevent_st* e : copy_done_) cudaEventDestroy(e);
  for (CUevent_st* e : compute_marks_) cudaEventDestroy(e);
  cudaStreamSynchronize(stream_);
  cudaFree(verdicts_);
  for (auto& [codecs, tables] : tq_tables_) cudaFree(tables.dev);
  graphs_.reset();
  cudaStreamDestroy(stream_);
}

absl::StatusOr<Buffer> CudaBackend::Allocate(size_t bytes) {
  if (bytes == 0) return Buffer();
  void* p = nullptr;
  if (const cudaError_t err = cudaMalloc(&p, bytes); err != cudaSuccess) {
    cudaGetLastError();  // an out-of-memory error is not sticky; clear it
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    return absl::ResourceExhaustedError(absl::StrCat(
        "cuda backend: cannot allocate ", bytes, " bytes (", base::FormatBytes(bytes),
        ") of device memory: ", cudaGetErrorName(err), "; ", base::FormatBytes(free_bytes),
        " free of ", base::FormatBytes(total_bytes)));
  }
  return Buffer(p, bytes, [](void* q) {
    cuda::StepGraphs::MemoryFreed();
    MOE_CUDA_CHECK(cudaFree(q));
  });
}

base::MemoryTotals CudaBackend::Memory() {
  size_t free_bytes = 0, total_bytes = 0;
  MOE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {free_bytes, total_bytes};
}

absl::StatusOr<Buffer> CudaBackend::AllocateHost(size_t bytes) {
  if (bytes == 0) return Buffer();
  // 4 KiB-aligned as the contract says: cudaHostAlloc's small blocks need not be (H200, driver
  // 580, stop 42: golden_store_gpu_test's 256 KiB host tier was not, and the store refused it),
  // so the block is padded and the pointer aligned up.
  constexpr size_t kAlign = 4096;
  void* base = nullptr;
  if (const cudaError_t err = cudaHostAlloc(&base, bytes + kAlign, cudaHostAllocDefault);
      err != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda backend: cannot allocate ", bytes, " bytes (", base::FormatBytes(bytes),
                     ") of pinned host memory: ", cudaGetErrorName(err)));
  }
  const uintptr_t aligned = (reinterpret_cast<uintptr_t>(base) + kAlign - 1) / kAlign * kAlign;
  return Buffer(reinterpret_cast<void*>(aligned), bytes,
                [base](void*) { MOE_CUDA_CHECK(cudaFreeHost(base)); });
}

absl::StatusOr<DeviceTensor> CudaBackend::Upload(const TensorView& host) {
  DeviceTensor t;
  MOE_ASSIGN_OR_RETURN(t.storage, Allocate(host.bytes()));
  if (host.bytes() > 0) {
    graphs_->Stop();
    MOE_CUDA_CHECK(cudaMemcpyAsync(t.storage.data(), host.data, host.bytes(),
                                   cudaMemcpyHostToDevice, stream_));
    MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the caller may free `host` next
  }
  t.view = host;
  t.view.data = t.storage.data();
  return t;
}

void CudaBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  // `src` may be reused on return: the runtime stages pageable memory before returning, a
  // recorded copy reads the step graphs' arena.
  graphs_->CopyFromHost(dst, src, bytes, bytes);
}

void CudaBackend::CopyToHostQueued(void* dst, const void* src, size_t bytes) {
  graphs_->Stop();
  MOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  MOE_CUDA_CHECK(cudaEventRecord(host_copies_done_, stream_));
}

void CudaBackend::WaitForHostCopies() { MOE_CUDA_CHECK(cudaEventSynchronize(host_copies_done_)); }

void CudaBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  graphs_->Stop();
  MOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  graphs_->CopyOnDevice(dst, src, bytes);
}

namespace {

__global__ void ZeroKernel(uint4* dst, int64_t n) {
  cuda::WaitForPriorKernel();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = make_uint4(0, 0, 0, 0);
  }
}

}  // namespace

void CudaBackend::Zero(void* dst, size_t bytes) {
  // A kernel where it can (16-byte words): a memset between two kernels would stop the second
  // one's early launch (cuda::Launch), as a copy does.
  if (bytes % 16 != 0 || reinterpret_cast<uintptr_t>(dst) % 16 != 0) {
    graphs_->Memset(dst, 0, bytes);
    return;
  }
  const int64_t n = static_cast<int64_t>(bytes / 16);
  if (n == 0) return;
  constexpr int kThreads = 256;
  const auto blocks =
      static_cast<unsigned>(std::min<int64_t>(cuda::CeilDiv(n, kThreads), 4 * num_sms_));
  cuda::Launch(ZeroKernel, blocks, kThreads, 0, stream_, static_cast<uint4*>(dst), n);
}

void CudaBackend::BeginStep(int64_t num_tokens, bool replayable) {
  graphs_->Stop();  // what the last step left recorded
  cuda::g_overlap_launches = overlap_ == OverlapLaunches::kAlways ||
                             (overlap_ == OverlapLaunches::kSmallSteps && num_tokens <= 8);
  if (use_graphs_ && replayable && num_tokens <= graph_max_tokens_) graphs_->Start();
}

void CudaBackend::EndStep() { graphs_->Stop(); }

CudaBackend::GraphStats CudaBackend::graph_stats() const { return graphs_->stats(); }

std::string CudaBackend::IssueStats() const {
  const GraphStats s = graph_stats();
  return absl::StrCat("step graphs: ", s.replayed, " fragments replayed, ", s.built, " built, ",
                      s.direct, " issued directly", use_graphs_ ? "" : " (MOE_CUDA_GRAPHS=0)");
}

void CudaBackend::Synchronize() {
  graphs_->Stop();
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

uint64_t CudaBackend::MarkCompute() {
  graphs_->Stop();  // the mark follows the work issued so far
  ++marks_;
  MOE_CUDA_CHECK(cudaEventRecord(compute_marks_[marks_ % kComputeMarks], stream_));
  return marks_;
}

uint64_t CudaBackend::CopyToDeviceOnCopyQueue(void* dst, const void* src, size_t bytes,
                                              uint64_t after_mark) {
  if (after_mark != 0) {
    CUevent_st* mark = compute_marks_[after_mark % kComputeMarks];
    MOE_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, mark, 0));
  }
  MOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy_stream_));
  ++copies_;
  MOE_CUDA_CHECK(cudaEventRecord(copy_done_[copies_ % kCopyEvents], copy_stream_));
  return copies_;
}

void CudaBackend::SynchronizeCopies() { MOE_CUDA_CHECK(cudaStreamSynchronize(copy_stream_)); }

void CudaBackend::WaitForCopy(uint64_t number) {
  if (number == 0 || number > copies_) return;
  if (copies_ - number < kCopyEvents) {  // its event not yet recorded again by a later copy
    MOE_CUDA_CHECK(cudaEventSynchronize(copy_done_[number % kCopyEvents]));
  } else {
    SynchronizeCopies();
  }
}

unsigned long long* CudaBackend::StepVerdicts() {
  if (verdicts_ == nullptr) {
    MOE_CUDA_CHECK(cudaMalloc(&verdicts_, 2 * sizeof(unsigned long long)));
    graphs_->Memset(verdicts_, 0xff, 2 * sizeof(unsigned long long));
  }
  return verdicts_;
}

unsigned int* CudaBackend::RoutingVerdict() {
  routing_verdict_pending_ = true;
  return reinterpret_cast<unsigned int*>(StepVerdicts() + 1);  // the low half (little-endian)
}

void CudaBackend::KeepRoutingVerdict(unsigned long long slot) {
  if (!routing_verdict_pending_) return;
  routing_verdict_pending_ = false;
  const auto code = static_cast<uint32_t>(slot);
  routing_fault_ = std::min(routing_fault_, code);
  if (code != kNoRoutingFault) graphs_->Memset(verdicts_ + 1, 0xff, sizeof(unsigned long long));
}

absl::Status CudaBackend::TakeRoutingError() {
  if (routing_verdict_pending_) {  // not fetched by TakeKvWriteError: a step without paged KV
    unsigned long long slot = ~0ull;
    CopyToHost(&slot, verdicts_ + 1, sizeof(slot));
    KeepRoutingVerdict(slot);
  }
  const uint32_t code = routing_fault_;
  routing_fault_ = kNoRoutingFault;
  return RoutingError(code);
}

CudaBackend::Scratch::~Scratch() { cudaFree(data); }

void* CudaBackend::Reserve(Scratch& s, size_t bytes) {
  if (bytes <= s.bytes) return s.data;
  const size_t grown = std::max(bytes, s.bytes * 2);
  Synchronize();  // queued (or recorded) kernels may still read the old one
  cuda::StepGraphs::MemoryFreed();
  MOE_CUDA_CHECK(cudaFree(s.data));
  s.data = nullptr;
  s.bytes = 0;
  s.staged.clear();
  // Scratch grows inside ops, which return nothing: running out here is fatal, and says so.
  const cudaError_t err = cudaMalloc(&s.data, grown);
  MOE_CHECK(err == cudaSuccess) << "cuda backend: cannot allocate " << grown
                                << " bytes of op scratch: " << cudaGetErrorName(err);
  s.bytes = grown;
  return s.data;
}

void* CudaBackend::StageHostArgs(Scratch& s, const void* host, size_t bytes) {
  const auto* first = static_cast<const unsigned char*>(host);
  if (bytes > 0 && s.staged.size() == bytes && std::equal(first, first + bytes, s.staged.begin())) {
    return s.data;  // still on the device: nothing since has written it
  }
  // A recorded copy moves a power of two of at least 256 bytes, so that a block table growing by
  // one entry a step keeps the step's graph.
  const size_t copy_bytes = graphs_->recording() ? std::max<size_t>(256, std::bit_ceil(bytes))
                                                 : bytes;
  void* dst = Reserve(s, copy_bytes);
  graphs_->CopyFromHost(dst, host, bytes, copy_bytes);
  s.staged.assign(first, first + bytes);
  return dst;
}

}  // namespace moe::kernels

