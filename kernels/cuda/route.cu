// Router on the GPU: softmax or sigmoid scores, top-k of score + selection bias (ties to the lower
// id), the unbiased scores as weights, optional renormalise, scaling (backend.h RouteArgs).
// One warp per token; each lane holds experts lane, lane + 32, ... in registers.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace moe::kernels::cuda {
namespace {

constexpr int kRouteWarps = 4;

// PER_LANE = ceil(E / 32) rounded up to the dispatched size.
// A token whose logits are not all finite gets experts 0..K-1 with weight 0, and its layer's
// fault code goes into *verdict (the lowest kept; Backend::TakeRoutingError).
template <int PER_LANE>
__global__ __launch_bounds__(kRouteWarps * kWarp) void RouteKernel(RouteArgs a,
                                                                    unsigned int* verdict) {
  WaitForPriorKernel();
  const int lane = threadIdx.x % kWarp;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + threadIdx.x / kWarp;
  if (t >= a.num_tokens) return;
  const int E = a.num_experts, K = a.top_k;
  const float* logits = a.logits + t * E;  // [E]
  float p[PER_LANE];
  float max_logit = -INFINITY;
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) {
    const int e = lane + i * kWarp;
    p[i] = e < E ? logits[e] : -INFINITY;
    max_logit = fmaxf(max_logit, p[i]);
  }
  bool finite = true;
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) finite = finite && (lane + i * kWarp >= E || isfinite(p[i]));
  if (!__all_sync(0xffffffffu, finite)) {
    if (lane < K) {
      a.expert_ids[t * K + lane] = lane;
      a.weights[t * K + lane] = 0.f;
    }
    if (lane == 0) atomicMin(verdict, 2u * static_cast<unsigned>(a.layer) + Backend::kNonFiniteLogits);
    return;
  }
  // p: the scores (softmax or sigmoid); key: what the top-k ranks, score + selection bias.
  // Chosen experts and padding get key -inf (keys are finite: the logits and biases are).
  float key[PER_LANE];
  if (a.scoring == RouteScoring::kSigmoid) {
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
      p[i] = lane + i * kWarp < E ? 1.f / (1.f + expf(-p[i])) : 0.f;
    }
  } else {
    max_logit = WarpMax(max_logit);
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
      p[i] = lane + i * kWarp < E ? expf(p[i] - max_logit) : 0.f;
      sum += p[i];
    }
    sum = WarpSum(sum);
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) p[i] /= sum;
  }
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) {
    const int e = lane + i * kWarp;
    key[i] = e < E ? (a.selection_bias != nullptr ? p[i] + a.selection_bias[e] : p[i]) : -INFINITY;
  }

  float my_weight = 0.f;  // lane k keeps the k-th choice
  int my_id = 0;
  float top_sum = 0.f;  // summed in choice order, like the CPU reference
  for (int k = 0; k < K; ++k) {
    float best = -INFINITY, best_p = 0.f;
    int best_id = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
      if (key[i] > best) {  // ascending e within a lane: strict > keeps the lower id on ties
        best = key[i];
        best_p = p[i];
        best_id = lane + i * kWarp;
      }
    }
#pragma unroll
    for (int o = kWarp / 2; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const float op = __shfl_xor_sync(0xffffffffu, best_p, o);
      const int oid = __shfl_xor_sync(0xffffffffu, best_id, o);
      if (ob > best || (ob == best && oid < best_id)) {
        best = ob;
        best_p = op;
        best_id = oid;
      }
    }
    top_sum += best_p;
    if (lane == k) {
      my_weight = best_p;
      my_id = best_id;
    }
    if (best_id % kWarp == lane) {
#pragma unroll
      for (int i = 0; i < PER_LANE; ++i) {
        if (lane + i * kWarp == best_id) key[i] = -INFINITY;
      }
    }
  }
  if (lane < K) {
    a.expert_ids[t * K + lane] = my_id;
    a.weights[t * K + lane] =
        (a.renormalize ? my_weight / (top_sum + a.renormalize_eps) : my_weight) * a.scaling;
  }
}

}  // namespace
}  // namespace moe::kernels::cuda

namespace moe::kernels {

void CudaBackend::Route(const RouteArgs& a) {
  MOE_CHECK(a.top_k > 0 && a.top_k <= a.num_experts && a.top_k <= cuda::kWarp)
      << "Route: top_k " << a.top_k << " of " << a.num_experts << " (at most 32 on CUDA)";
  if (a.num_tokens == 0) return;
  const unsigned blocks = static_cast<unsigned>(cuda::CeilDiv(a.num_tokens, cuda::kRouteWarps));
  const int threads = cuda::kRouteWarps * cuda::kWarp;
  const int per_lane = static_cast<int>(cuda::CeilDiv(a.num_experts, cuda::kWarp));
  if (per_lane <= 1) {
    cuda::Launch(cuda::RouteKernel<1>, blocks, threads, 0, stream_, a,
                 RoutingVerdict());
  } else if (per_lane <= 2) {
    cuda::Launch(cuda::RouteKernel<2>, blocks, threads, 0, stream_, a,
                 RoutingVerdict());
  } else if (per_lane <= 4) {
    cuda::Launch(cuda::RouteKernel<4>, blocks, threads, 0, stream_, a,
                 RoutingVerdict());
  } else if (per_lane <= 8) {
    cuda::Launch(cuda::RouteKernel<8>, blocks, threads, 0, stream_, a,
                 RoutingVerdict());
  } else if (per_lane <= 16) {
    cuda::Launch(cuda::RouteKernel<16>, blocks, threads, 0, stream_, a,
                 RoutingVerdict());
  } else {
    MOE_CHECK(false) << "Route: unsupported num_experts " << a.num_experts << " (at most 512)";
  }
}

}  // namespace moe::kernels
