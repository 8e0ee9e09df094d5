// Grouped expert SwiGLU MLP on the GPU: all experts of a call in one launch per projection.
//
// Legend: R routed rows (tokens grouped per expert), H hidden, I expert width.
//   gate_up[r, :I]  = x[rows[r]] Gate_e^T        one grouped launch (groups = experts)
//   gate_up[r, I:]  = x[rows[r]] Up_e^T          one grouped launch
//   act[r]          = F.silu(gate_up[r, :I]) * gate_up[r, I:]
//   (at most kMatVecMaxRows rows per expert, e.g. decode: these three are one matrix-vector launch)
//   out[rows[r]]   += row_weights[r] * act[r] Down_e^T   one grouped launch, atomicAdd scatter
// The atomics make the order of the (at most K) additions into one out element vary from run to
// run: results can differ in the last bit, unlike the CPU reference.
// ExpertFfnRouted (every expert of the layer in a device pointer table), two plans, both on the
// GPU with no host synchronisation:
//  - at most half as many (token, k) pairs as experts (2 T K <= E, decode of a few sequences):
//    group y is routed pair y, its matrices looked up by the kernels from Route's expert ids;
//  - more (batches, prefill chunks): PlanRoutedExpertsKernel sorts the pairs into per-expert
//    groups (counts, offsets, rows), cut into chunks of at most 8 or 16 rows for the tensor-core
//    matrix-vector kernel or kRoutedChunkLarge rows for the tensor-core GEMM, so that
//    each expert's weights are read once per chunk instead of once per pair.
#include <algorithm>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.cuh"

namespace moe::kernels {
namespace {

// Planned ExpertFfnRouted: rows per group. 8 and 16 are the tensor-core matrix-vector kernel's one
// and two n-tiles (one pass over the weights per chunk); 16 for int4 experts (the format with a
// two-tile kernel) once an expert averages more than 8 pairs (a decode batch of 256 on 128
// experts top-8 averages 16: chunks of 8 pass over most experts twice; +2% a step, H200), 8
// below (the two-tile kernel holds x for 16 rows: one block an SM). 128 is two row tiles of the
// tensor-core GEMM (GemmMmaKernel), past kMatVecMaxRows so that Dispatch picks it; it pays once
// an expert averages more than kRoutedLargeFrom pairs.
constexpr int kRoutedChunkSmall = 8;
constexpr int kRoutedChunkMid = 16;
constexpr int kRoutedChunkLarge = 128;
constexpr int64_t kRoutedLargeFrom = 32;
constexpr int kPlanThreads = 1024;

constexpr int kStageBlocks = 32;  // per routed pair: ~2 MB of loads in flight, PCIe's latency
constexpr size_t kStageAlign = 256;

__host__ __device__ size_t StageAligned(size_t bytes) { return (bytes + kStageAlign - 1) / kStageAlign * kStageAlign; }

// Copies `bytes` from src (host memory read over PCIe) to dst with the blocks of this pair,
// four 16-byte loads in flight a thread.
__device__ void StageCopy(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  const uint64_t tid = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  uint64_t done = 0;
  if (reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    const auto* s = reinterpret_cast<const uint4*>(src);
    auto* d = reinterpret_cast<uint4*>(dst);
    const uint64_t n = bytes / 16;
    uint64_t i = tid;
    for (; i + 3 * stride < n; i += 4 * stride) {
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = s[i + u * stride];
#pragma unroll
      for (int u = 0; u < 4; ++u) d[i + u * stride] = v[u];
    }
    for (; i < n; i += stride) d[i] = s[i];
    done = n * 16;
  }
  for (uint64_t i = done + tid; i < bytes; i += stride) dst[i] = src[i];
}

// Routed pair y = blockIdx.y names expert e = ids[y]. The pair that names e first writes e's
// pointers into `table` (what the expert kernels read); when e is in host memory its blocks first
// copy its three matrices into VRAM slot y and the pointers go there.
__global__ void StageRoutedExpertsKernel(const int32_t* ids, int num_experts,
                                         const uint8_t* in_host, const void* const* gate,
                                         const void* const* up, const void* const* down,
                                         const void** table, uint8_t* staged, uint64_t gate_bytes,
                                         uint64_t up_bytes, uint64_t down_bytes,
                                         uint64_t slot_bytes) {
  cuda::WaitForPriorKernel();
  const int y = static_cast<int>(blockIdx.y);
  const int e = ids[y];
  if (e < 0 || e >= num_experts) return;  // no expert: the expert kernels skip it and report it
  for (int z = 0; z < y; ++z) {
    if (ids[z] == e) return;  // an earlier pair stages it
  }
  const bool host = in_host[e] != 0 && gate[e] != nullptr;  // null: not resident, skipped
  uint8_t* g = staged + y * slot_bytes;
  uint8_t* u = g + StageAligned(gate_bytes);
  uint8_t* d = u + StageAligned(up_bytes);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    table[e] = host ? g : gate[e];
    table[num_experts + e] = host ? u : up[e];
    table[2 * num_experts + e] = host ? d : down[e];
  }
  if (!host) return;
  StageCopy(g, static_cast<const uint8_t*>(gate[e]), gate_bytes);
  StageCopy(u, static_cast<const uint8_t*>(up[e]), up_bytes);
  StageCopy(d, static_cast<const uint8_t*>(down[e]), down_bytes);
}

// Where expert e's three matrices are read: its VRAM copy in `staged` (slot e) when it is in the
// host tier (in_host, copied by StageExpertsByIdKernel), else where the tables point.
struct RoutedPointers {
  const void* const* gate;
  const void* const* up;
  const void* const* down;
  const uint8_t* in_host;  // null: every expert in VRAM
  uint8_t* staged;
  uint64_t up_offset, down_offset, slot_bytes;
};

// One block: the n routed pairs (ids, weights: [T, K] row-major) grouped by expert. Writes
// counts[e]; rows / row_weights [n] in expert order (ascending id; within an expert in arrival
// order, which changes no result: each row is its own dot product); and the group tables
// groups[3][max_groups] (gate, up, down) of chunks of at most `chunk` rows, experts whose gate
// pointer is null (not resident) left out, the unused entries zero rows. An id outside [0, E)
// is skipped (its row stays unwritten and in no group) and `fault_code` goes into *verdict.
__global__ void PlanRoutedExpertsKernel(const int32_t* ids, const float* weights, int n,
                                        int top_k, int num_experts, int chunk, int max_groups,
                                        RoutedPointers ptrs, int32_t* rows, float* row_weights,
                                        int32_t* counts, cuda::GemmGroup* groups,
                                        unsigned int* verdict, unsigned int fault_code) {
  cuda::WaitForPriorKernel();
  extern __shared__ int plan_smem[];
  int* count = plan_smem;                     // [E]
  int* offset = count + num_experts;          // [E] first row
  int* cursor = offset + num_experts;         // [E] rows placed so far
  int* first_group = cursor + num_experts;    // [E] first chunk's group
  __shared__ int total_groups;
  const int tid = threadIdx.x;
  for (int e = tid; e < num_experts; e += blockDim.x) count[e] = cursor[e] = 0;
  __syncthreads();
  for (int i = tid; i < n; i += blockDim.x) {
    const int e = ids[i];
    if (e >= 0 && e < num_experts) {
      atomicAdd(&count[e], 1);
    } else {
      atomicMin(verdict, fault_code);
    }
  }
  __syncthreads();
  // Exclusive scans of rows and of chunks over the experts: warp 0, each lane a contiguous run.
  if (tid < cuda::kWarp) {
    const int per = (num_experts + cuda::kWarp - 1) / cuda::kWarp;
    const int b = min(num_experts, tid * per), e_end = min(num_experts, b + per);
    int my_rows = 0, my_groups = 0;
    for (int e = b; e < e_end; ++e) {
      my_rows += count[e];
      if (ptrs.gate[e] != nullptr) my_groups += (count[e] + chunk - 1) / chunk;
    }
    int rows_before = my_rows, groups_before = my_groups;  // inclusive scans, then exclusive
#pragma unroll
    for (int d = 1; d < cuda::kWarp; d *= 2) {
      const int r = __shfl_up_sync(0xffffffffu, rows_before, d);
      const int g = __shfl_up_sync(0xffffffffu, groups_before, d);
      if (tid >= d) rows_before += r, groups_before += g;
    }
    if (tid == cuda::kWarp - 1) total_groups = groups_before;
    rows_before -= my_rows, groups_before -= my_groups;
    for (int e = b; e < e_end; ++e) {
      offset[e] = rows_before;
      first_group[e] = groups_before;
      rows_before += count[e];
      if (ptrs.gate[e] != nullptr) groups_before += (count[e] + chunk - 1) / chunk;
    }
  }
  __syncthreads();
  for (int i = tid; i < n; i += blockDim.x) {
    const int e = ids[i];
    if (e < 0 || e >= num_experts) continue;
    const int at = offset[e] + atomicAdd(&cursor[e], 1);
    rows[at] = i / top_k;
    row_weights[at] = weights[i];
  }
  for (int e = tid; e < num_experts; e += blockDim.x) {
    counts[e] = count[e];
    if (ptrs.gate[e] == nullptr) continue;
    const bool host = ptrs.in_host != nullptr && ptrs.in_host[e] != 0;
    const uint8_t* slot = ptrs.staged + e * ptrs.slot_bytes;
    const void* w[3] = {host ? slot : ptrs.gate[e], host ? slot + ptrs.up_offset : ptrs.up[e],
                        host ? slot + ptrs.down_offset : ptrs.down[e]};
    for (int c = 0; c * chunk < count[e]; ++c) {
      const int g = first_group[e] + c;
      const int64_t begin = offset[e] + c * chunk, rows_in = min(chunk, count[e] - c * chunk);
      for (int m = 0; m < 3; ++m) groups[m * max_groups + g] = {w[m], begin, rows_in};
    }
  }
  for (int g = total_groups + tid; g < max_groups; g += blockDim.x) {
    for (int m = 0; m < 3; ++m) groups[m * max_groups + g] = {nullptr, 0, 0};
  }
}

// Block row e = blockIdx.y copies expert e's matrices from the host tier into VRAM slot e when
// the plan routed a pair to it and it is in host memory.
__global__ void StageExpertsByIdKernel(const int32_t* counts, RoutedPointers ptrs,
                                       uint64_t gate_bytes, uint64_t up_bytes,
                                       uint64_t down_bytes) {
  cuda::WaitForPriorKernel();
  const int e = static_cast<int>(blockIdx.y);
  if (counts[e] == 0 || ptrs.in_host[e] == 0 || ptrs.gate[e] == nullptr) return;
  uint8_t* slot = ptrs.staged + e * ptrs.slot_bytes;
  StageCopy(slot, static_cast<const uint8_t*>(ptrs.gate[e]), gate_bytes);
  StageCopy(slot + ptrs.up_offset, static_cast<const uint8_t*>(ptrs.up[e]), up_bytes);
  StageCopy(slot + ptrs.down_offset, static_cast<const uint8_t*>(ptrs.down[e]), down_bytes);
}

}  // namespace

void CudaBackend::ExpertFfn(const ExpertFfnArgs& a) {
  const int64_t H = a.hidden_size;
  const int num_experts = static_cast<int>(a.experts.size());
  if (num_experts == 0) return;
  const ExpertWeights& w0 = *a.experts[0].weights;
  const int64_t I = w0.gate.dim(0);
  const DType dtype = w0.gate.dtype;
  // The table is [gate groups | up groups | down groups], copied in with one staged copy.
  std::vector<cuda::GemmGroup> table(3 * static_cast<size_t>(num_experts));
  int64_t total_rows = 0, max_rows = 0;
  for (int e = 0; e < num_experts; ++e) {
    const ExpertWork& work = a.experts[e];
    const ExpertWeights& w = *work.weights;
    MOE_CHECK(w.gate.rank == 2 && w.up.rank == 2 && w.down.rank == 2 && w.gate.dim(0) == I &&
              w.gate.dim(1) == H && w.up.dim(0) == I && w.up.dim(1) == H && w.down.dim(0) == H &&
              w.down.dim(1) == I)
        << "ExpertFfn: expert " << e << " shapes gate [" << w.gate.dim(0) << "," << w.gate.dim(1)
        << "] down [" << w.down.dim(0) << "," << w.down.dim(1) << "] H " << H << " I " << I;
    MOE_CHECK(w.gate.dtype == dtype && w.up.dtype == dtype && w.down.dtype == dtype &&
              w.gate.group_size == w0.gate.group_size && w.up.group_size == w0.gate.group_size &&
              w.down.group_size == w0.down.group_size)
        << "ExpertFfn: expert " << e << " mixes dtypes or group sizes with " << DTypeName(dtype);
    MOE_CHECK(work.row_begin >= 0 && work.row_count >= 0)
        << "ExpertFfn: expert " << e << " rows [" << work.row_begin << ", +" << work.row_count
        << ")";
    table[e] = {w.gate.data, work.row_begin, work.row_count};
    table[num_experts + e] = {w.up.data, work.row_begin, work.row_count};
    table[2 * num_experts + e] = {w.down.data, work.row_begin, work.row_count};
    total_rows = std::max(total_rows, work.row_begin + work.row_count);
    max_rows = std::max(max_rows, work.row_count);
  }
  if (max_rows == 0) return;
  ExpertGroups groups;
  groups.count = num_experts;
  groups.table = static_cast<const cuda::GemmGroup*>(
      StageHostArgs(args_, table.data(), table.size() * sizeof(cuda::GemmGroup)));
  LaunchExpertFfn(groups, max_rows, total_rows, w0, a.x, a.num_tokens, a.rows, a.row_weights, a.out,
                  H);
}

void CudaBackend::ExpertFfnRouted(const ExpertFfnRoutedArgs& a) {
  const int64_t n = a.num_tokens * a.top_k;
  if (n == 0) return;
  MOE_CHECK(a.experts != nullptr && a.experts->num_experts > 0 && n <= 65535)
      << "ExpertFfnRouted: " << n << " routed rows";
  // Shapes and format from a resident expert (all share them).
  const ExpertWeights* w0 = nullptr;
  for (int e = 0; e < a.experts->num_experts && w0 == nullptr; ++e) {
    if (a.experts->views[e].gate.data != nullptr) w0 = &a.experts->views[e];
  }
  if (w0 == nullptr) return;
  // Planned past half as many pairs as experts: from there on a quarter or more of the pairs
  // repeat an expert, whose weights the plan's groups read once, not once a pair (H200, 128
  // experts top-8: 12 / 16 sequences +3-4% / +11%; at 8, 22% repeats, plan and pairs tie;
  // tests/bench/NOTES.md, stop 47).
  if (2 * n > a.experts->num_experts) return PlannedExpertFfnRouted(a, *w0);
  // Routed pair y reads token y / top_k: a table made once per top_k (and grown with n).
  if (a.top_k != routed_rows_top_k_ || n > routed_rows_count_) {
    routed_rows_count_ = std::max<int64_t>(n, 1024);
    routed_rows_top_k_ = a.top_k;
    std::vector<int32_t> rows(routed_rows_count_);
    for (int64_t y = 0; y < routed_rows_count_; ++y) rows[y] = static_cast<int32_t>(y / a.top_k);
    StageHostArgs(routed_rows_, rows.data(), rows.size() * sizeof(int32_t));
  }
  ExpertGroups groups;
  groups.count = static_cast<int>(n);
  groups.routed_ids = a.expert_ids;
  groups.routed_experts = a.experts->num_experts;
  groups.routing_verdict = RoutingVerdict();
  groups.routing_code = 2u * static_cast<unsigned>(a.layer) + kExpertOutOfRange;
  groups.gate = a.experts->gate;
  groups.up = a.experts->up;
  groups.down = a.experts->down;
  if (a.experts->in_host != nullptr) {
    const int E = a.experts->num_experts;
    const size_t table_bytes = StageAligned(3 * static_cast<size_t>(E) * sizeof(void*));
    const size_t slot = StageAligned(w0->gate.bytes()) + StageAligned(w0->up.bytes()) +
                        StageAligned(w0->down.bytes());
    auto* base = static_cast<uint8_t*>(
        Reserve(staged_experts_, table_bytes + static_cast<size_t>(n) * slot));
    auto** table = reinterpret_cast<const void**>(base);
    cuda::Launch(StageRoutedExpertsKernel, dim3(kStageBlocks, static_cast<unsigned>(n)), 256, 0,
                 stream_, a.expert_ids, E, a.experts->in_host, a.experts->gate, a.experts->up,
                 a.experts->down, table, base + table_bytes, uint64_t{w0->gate.bytes()},
                 uint64_t{w0->up.bytes()}, uint64_t{w0->down.bytes()}, uint64_t{slot});
    groups.gate = table;
    groups.up = table + E;
    groups.down = table + 2 * E;
  }
  LaunchExpertFfn(groups, 1, n, *w0, a.x, a.num_tokens,
                  static_cast<const int32_t*>(routed_rows_.data), a.weights, a.out, a.hidden_size);
}

// ExpertFfnRouted for more pairs than experts: the plan above, then the grouped launches.
void CudaBackend::PlannedExpertFfnRouted(const ExpertFfnRoutedArgs& a, const ExpertWeights& w0) {
  const int64_t n = a.num_tokens * a.top_k;
  const int E = a.experts->num_experts;
  const bool two_tiles = w0.gate.dtype == DType::kQ4 && n > kRoutedChunkSmall * E;
  int64_t chunk = n > kRoutedLargeFrom * E ? kRoutedChunkLarge
                  : two_tiles              ? kRoutedChunkMid
                                           : kRoutedChunkSmall;
  if (routed_chunk_override_ > 0) chunk = routed_chunk_override_;
  // Each expert's last chunk may be partial: at most n / chunk full ones plus one per expert.
  const int64_t max_groups = std::min<int64_t>(n, n / chunk + E);
  MOE_CHECK(max_groups <= 65535) << "ExpertFfnRouted: " << n << " routed pairs";
  const size_t groups_bytes = StageAligned(3 * max_groups * sizeof(cuda::GemmGroup));
  const size_t rows_bytes = StageAligned(n * sizeof(int32_t));
  const size_t counts_bytes = StageAligned(E * sizeof(int32_t));
  auto* base = static_cast<uint8_t*>(
      Reserve(routed_plan_, groups_bytes + 2 * rows_bytes + counts_bytes));
  auto* groups = reinterpret_cast<cuda::GemmGroup*>(base);
  auto* rows = reinterpret_cast<int32_t*>(base + groups_bytes);
  auto* row_weights = reinterpret_cast<float*>(base + groups_bytes + rows_bytes);
  auto* counts = reinterpret_cast<int32_t*>(base + groups_bytes + 2 * rows_bytes);

  RoutedPointers ptrs{a.experts->gate, a.experts->up, a.experts->down, a.experts->in_host,
                      nullptr, 0, 0, 0};
  if (ptrs.in_host != nullptr) {
    ptrs.up_offset = StageAligned(w0.gate.bytes());
    ptrs.down_offset = ptrs.up_offset + StageAligned(w0.up.bytes());
    ptrs.slot_bytes = ptrs.down_offset + StageAligned(w0.down.bytes());
    ptrs.staged = static_cast<uint8_t*>(Reserve(staged_experts_, E * ptrs.slot_bytes));
  }
  const size_t smem = 4 * static_cast<size_t>(E) * sizeof(int);
  cuda::Launch(PlanRoutedExpertsKernel, 1, kPlanThreads, smem, stream_, a.expert_ids, a.weights,
               static_cast<int>(n), a.top_k, E, static_cast<int>(chunk),
               static_cast<int>(max_groups), ptrs, rows, row_weights, counts, groups,
               RoutingVerdict(), 2u * static_cast<unsigned>(a.layer) + kExpertOutOfRange);
  if (ptrs.in_host != nullptr) {
    cuda::Launch(StageExpertsByIdKernel, dim3(kStageBlocks, static_cast<unsigned>(E)), 256, 0,
                 stream_, counts, ptrs, uint64_t{w0.gate.bytes()}, uint64_t{w0.up.bytes()},
                 uint64_t{w0.down.bytes()});
  }
  ExpertGroups plan;
  plan.count = static_cast<int>(max_groups);
  plan.table = groups;
  LaunchExpertFfn(plan, chunk, n, w0, a.x, a.num_tokens, rows, row_weights, a.out, a.hidden_size);
}

// The grouped SwiGLU launches over `groups` (every expert has w0's dtype and shapes).
void CudaBackend::LaunchExpertFfn(const ExpertGroups& groups, int64_t max_rows, int64_t total_rows,
                                  const ExpertWeights& w0, const float* x, int64_t x_rows,
                                  const int32_t* rows, const float* row_weights, float* out,
                                  int64_t H) {
  // Projection `which` (0 gate, 1 up, 2 down) of every group, into q.
  auto set_groups = [&](cuda::GemmParams& q, int which) {
    q.num_groups = groups.count;
    if (groups.table != nullptr) {
      q.groups = groups.table + which * groups.count;
    } else {
      q.routed_ids = groups.routed_ids;
      q.routed_w = which == 0 ? groups.gate : which == 1 ? groups.up : groups.down;
      q.routed_experts = groups.routed_experts;
      q.routing_verdict = groups.routing_verdict;
      q.routing_code = groups.routing_code;
    }
  };
  const int64_t I = w0.gate.dim(0);
  const DType dtype = w0.gate.dtype;
  // GEMMs (prefill): x split once for gate and up, act once for down (LaunchSplitForGemm).
  const bool split = split_gemm_ && max_rows > cuda::kMatVecMaxRows &&
                     cuda::PipelinedGemmTakes(dtype, H, w0.gate.group_size) &&
                     cuda::PipelinedGemmTakes(dtype, I, w0.down.group_size);
  // [R, 2I] gate|up, then [R, I] act, then (split) x's and act's splits
  const size_t acts = StageAligned(static_cast<size_t>(total_rows) * 3 * I * sizeof(float));
  const size_t x_split = split ? StageAligned(cuda::SplitForGemmBytes(x_rows, H)) : 0;
  const size_t act_split = split ? cuda::SplitForGemmBytes(total_rows, I) : 0;
  auto* base = static_cast<uint8_t*>(Reserve(work_, acts + x_split + act_split));
  float* gate_up = reinterpret_cast<float*>(base);
  float* act = gate_up + total_rows * 2 * I;

  cuda::GemmParams p;
  set_groups(p, 0);  // gate
  p.max_rows = max_rows;
  p.w_dtype = dtype;
  p.group_size = w0.gate.group_size;
  p.N = I;
  p.K = H;
  p.a = x;
  p.lda = H;
  p.a_rows = rows;
  p.num_sms = num_sms_;
  if (max_rows <= cuda::kMatVecMaxRows) {
    // Decode: gate, up and SiLU* in one matrix-vector launch, straight into act.
    if (groups.table != nullptr) {
      p.up_groups = groups.table + groups.count;
    } else {
      p.routed_up = groups.up;
    }
    p.c = act;
    p.ldc = I;
    cuda::LaunchGroupedGemm(p, stream_);
  } else {
    if (split) {
      cuda::LaunchSplitForGemm(x, x_rows, H, H, dtype, base + acts, stream_);
      p.a_split = reinterpret_cast<const uint16_t*>(base + acts);
      p.a_split_rows = x_rows;
    }
    p.ldc = 2 * I;
    p.c = gate_up;
    cuda::LaunchGroupedGemm(p, stream_);
    set_groups(p, 1);  // up
    p.c = gate_up + I;
    cuda::LaunchGroupedGemm(p, stream_);
    cuda::LaunchSiluMul(act, gate_up, total_rows, I, num_sms_, stream_);
  }

  cuda::GemmParams d;  // down, weighted scatter-add into out
  set_groups(d, 2);
  d.max_rows = max_rows;
  d.w_dtype = dtype;
  d.group_size = w0.down.group_size;
  d.N = H;
  d.K = I;
  d.a = act;
  d.lda = I;
  d.c = out;
  d.ldc = H;
  d.c_rows = rows;
  d.c_scale = row_weights;
  d.accumulate = true;
  d.num_sms = num_sms_;
  if (split) {
    cuda::LaunchSplitForGemm(act, total_rows, I, I, dtype, base + acts + x_split, stream_);
    d.a_split = reinterpret_cast<const uint16_t*>(base + acts + x_split);
    d.a_split_rows = total_rows;
  }
  cuda::LaunchGroupedGemm(d, stream_);
}

}  // namespace moe::kernels
