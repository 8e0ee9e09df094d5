// StepGraphs (step_graph.cuh): recording, fragments, the graph cache.
#include "kernels/cuda/step_graph.cuh"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

#include "kernels/cuda/common.cuh"

namespace moe::kernels::cuda {

namespace {

constexpr size_t kFirstFragment = 16;   // items; doubles per fragment up to kMaxFragment
constexpr size_t kMaxFragment = 256;
constexpr size_t kMaxGraphs = 64;       // cached signatures, least recently used dropped
constexpr size_t kAlign = 16;
constexpr size_t kFirstArena = size_t{1} << 20;

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

uint64_t Hash(const std::vector<unsigned char>& bytes) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ bytes.size();
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes.data() + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 29;
  }
  for (; i < bytes.size(); ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  return h;
}

std::atomic<uint64_t> g_memory_frees{0};  // StepGraphs::MemoryFreed

}  // namespace

cudaStream_t RecordingStream(const StepGraphs& graphs) { return graphs.stream(); }

void RecordLaunch(StepGraphs& graphs, const void* kernel, const cudaLaunchConfig_t& config,
                  const void* const* args, const size_t* sizes, int count) {
  graphs.RecordKernel(kernel, config, args, sizes, count);
}

StepGraphs::StepGraphs(cudaStream_t stream) : stream_(stream) {
  MOE_CUDA_CHECK(cudaEventCreateWithFlags(&arena_read_, cudaEventDisableTiming));
}

StepGraphs::~StepGraphs() {
  if (recording()) g_recording = nullptr;  // the backend stops recording before it goes
  for (auto& [hash, e] : cache_) Forget(e);
  cudaEventSynchronize(arena_read_);
  cudaEventDestroy(arena_read_);
  cudaFreeHost(arena_);
}

bool StepGraphs::recording() const { return g_recording == this; }

void StepGraphs::MemoryFreed() { g_memory_frees.fetch_add(1, std::memory_order_relaxed); }

void StepGraphs::ForgetAll() {
  for (auto& [hash, e] : cache_) Forget(e);
  cache_.clear();
}

void StepGraphs::Start() {
  if (recording()) return;
  if (const uint64_t frees = g_memory_frees.load(std::memory_order_relaxed); frees != frees_seen_) {
    ForgetAll();
    frees_seen_ = frees;
  }
  MOE_CUDA_CHECK(cudaEventSynchronize(arena_read_));  // the last step's copies have run
  arena_used_ = 0;
  fragment_limit_ = kFirstFragment;
  g_recording = this;
}

void StepGraphs::Stop() {
  if (!recording()) return;
  Flush();
  g_recording = nullptr;
}

template <typename T>
void StepGraphs::Sign(const T& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(&v);
  signature_.insert(signature_.end(), p, p + sizeof(T));
}

void StepGraphs::Add(const Item& item) {
  items_.push_back(item);
  Sign(item.kind);
  if (item.kind == Kind::kKernel) {
    Sign(item.kernel);
    Sign(item.grid);
    Sign(item.block);
    Sign(item.smem);
    Sign(item.programmatic);
  } else {
    Sign(item.dst);
    Sign(item.src);
    Sign(item.bytes);
    Sign(item.copy_kind);
    Sign(item.value);
  }
  if (items_.size() >= fragment_limit_) {
    Flush();
    fragment_limit_ = std::min(2 * fragment_limit_, kMaxFragment);
  }
}

void StepGraphs::RecordKernel(const void* kernel, const cudaLaunchConfig_t& config,
                              const void* const* args, const size_t* sizes, int count) {
  Item item;
  item.kind = Kind::kKernel;
  item.kernel = kernel;
  item.grid = config.gridDim;
  item.block = config.blockDim;
  item.smem = config.dynamicSmemBytes;
  item.programmatic = config.numAttrs > 0;
  item.first_arg = static_cast<int>(arg_offsets_.size());
  item.num_args = count;
  for (int i = 0; i < count; ++i) {
    const size_t offset = arg_bytes_.size();
    const auto* p = static_cast<const unsigned char*>(args[i]);
    arg_bytes_.insert(arg_bytes_.end(), p, p + sizes[i]);
    arg_bytes_.resize(AlignUp(arg_bytes_.size()));
    arg_offsets_.push_back(offset);
    Sign(sizes[i]);
    signature_.insert(signature_.end(), p, p + sizes[i]);
  }
  Add(item);
}

StepGraphs::Item StepGraphs::CopyItem(void* dst, const void* src, size_t bytes,
                                      cudaMemcpyKind kind) {
  Item item;
  item.kind = Kind::kCopy;
  item.dst = dst;
  item.src = src;
  item.bytes = bytes;
  item.copy_kind = kind;
  return item;
}

void StepGraphs::Submit(const Item& item) {
  if (recording()) {
    Add(item);
  } else {
    IssueItem(item);
  }
}

void StepGraphs::CopyFromHost(void* dst, const void* host, size_t bytes, size_t copy_bytes) {
  if (!recording()) {
    IssueItem(CopyItem(dst, host, bytes, cudaMemcpyHostToDevice));
    return;
  }
  const size_t need = AlignUp(copy_bytes);
  if (arena_used_ + need > arena_bytes_) {
    // The recorded copies read the arena as it is: issue them and let them run before it goes.
    Flush();
    MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    ForgetAll();  // their copy nodes read the old arena
    MOE_CUDA_CHECK(cudaFreeHost(arena_));
    arena_ = nullptr;
    arena_bytes_ = std::max({kFirstArena, 2 * arena_bytes_, need});
    MOE_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&arena_), arena_bytes_,
                                 cudaHostAllocDefault));
    arena_used_ = 0;
  }
  unsigned char* src = arena_ + arena_used_;
  arena_used_ += need;
  std::memcpy(src, host, bytes);
  Add(CopyItem(dst, src, copy_bytes, cudaMemcpyHostToDevice));
}

void StepGraphs::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  Submit(CopyItem(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

void StepGraphs::Memset(void* dst, int value, size_t bytes) {
  Item item;
  item.kind = Kind::kMemset;
  item.dst = dst;
  item.value = value;
  item.bytes = bytes;
  Submit(item);
}

void StepGraphs::IssueItem(const Item& item) {
  switch (item.kind) {
    case Kind::kKernel: {
      cudaLaunchAttribute programmatic;
      programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      programmatic.val.programmaticStreamSerializationAllowed = 1;
      argv_.resize(item.num_args);
      for (int i = 0; i < item.num_args; ++i) {
        argv_[i] = arg_bytes_.data() + arg_offsets_[item.first_arg + i];
      }
      cudaLaunchConfig_t config = {};
      config.gridDim = item.grid;
      config.blockDim = item.block;
      config.dynamicSmemBytes = item.smem;
      config.stream = stream_;
      config.attrs = &programmatic;
      config.numAttrs = item.programmatic ? 1 : 0;
      MOE_CUDA_CHECK(cudaLaunchKernelExC(&config, item.kernel, argv_.data()));
      break;
    }
    case Kind::kCopy:
      MOE_CUDA_CHECK(cudaMemcpyAsync(item.dst, item.src, item.bytes, item.copy_kind, stream_));
      break;
    case Kind::kMemset:
      MOE_CUDA_CHECK(cudaMemsetAsync(item.dst, item.value, item.bytes, stream_));
      break;
  }
}

void StepGraphs::Issue() {
  for (const Item& item : items_) IssueItem(item);
}

void StepGraphs::Forget(Entry& e) {
  if (e.exec != nullptr) cudaGraphExecDestroy(e.exec);
  e.exec = nullptr;
}

void StepGraphs::Flush() {
  if (items_.empty()) return;
  const uint64_t hash = Hash(signature_);
  Entry& e = cache_[hash];
  if (e.signature != signature_) {  // new, or another signature with the same hash
    Forget(e);
    e.signature = signature_;
    Issue();
    ++stats_.direct;
  } else if (e.exec != nullptr) {
    MOE_CUDA_CHECK(cudaGraphLaunch(e.exec, stream_));
    ++stats_.replayed;
  } else if (capture_failed_) {
    Issue();
    ++stats_.direct;
  } else {
    // Seen before: capture it. Thread-local mode: other threads' CUDA calls are not affected.
    cudaGraph_t graph = nullptr;
    MOE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    Issue();
    cudaError_t err = cudaStreamEndCapture(stream_, &graph);
    if (err == cudaSuccess) err = cudaGraphInstantiate(&e.exec, graph, 0);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (err == cudaSuccess) {
      MOE_CUDA_CHECK(cudaGraphLaunch(e.exec, stream_));
      ++stats_.built;
    } else {  // nothing ran: issue the items as they are, and never capture again
      cudaGetLastError();
      e.exec = nullptr;
      capture_failed_ = true;
      std::fprintf(stderr, "cuda backend: step graph capture failed (%s: %s); launching directly\n",
                   cudaGetErrorName(err), cudaGetErrorString(err));
      Issue();
      ++stats_.direct;
    }
  }
  e.last_use = ++clock_;
  if (cache_.size() > kMaxGraphs) {
    auto oldest = cache_.begin();
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    }
    Forget(oldest->second);
    cache_.erase(oldest);
  }
  items_.clear();
  arg_bytes_.clear();
  arg_offsets_.clear();
  signature_.clear();
  MOE_CUDA_CHECK(cudaEventRecord(arena_read_, stream_));
}

}  // namespace moe::kernels::cuda
