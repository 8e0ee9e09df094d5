// Step graphs: a decode step's launches and copies recorded on the host and issued as CUDA
// graphs, each graph replayed whenever exactly the same launches recur.
//
// While recording, `Launch` (common.cuh) and the backend's copies and memsets append to a list
// instead of reaching the stream. The list is issued in fragments (the first after 16 items,
// then 32, 64, ... up to 256, so that the GPU starts while the host records the rest of the
// step) and when recording stops: at the step's first wait for the device (its results' copy).
// A fragment is keyed by its signature: every item's kernel, grid, block, shared memory, launch
// attribute and argument bytes, every copy's addresses and size. The first time a signature is
// seen its items are issued directly; the second time they are captured into a graph, which
// later fragments with that signature launch instead. A graph is a pure function of its signature, so
// a hit can never run different work than the items it stands for (argument bytes that merely
// differ, padding included, cost a rebuild, not a wrong result).
//
// Host bytes a step copies to the device (block tables, token ids, sampling parameters) go
// through a pinned arena that the graph's copy nodes read when they run; the recording of the
// next step starts only once the device has read it (an event). A copy may be asked to move
// more bytes than it needs (`copy_bytes`) so that a table growing by one entry keeps its graph.
//
// One engine thread drives it (as it drives the backend).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/cuda_backend.h"

namespace moe::kernels::cuda {

class StepGraphs {
 public:
  explicit StepGraphs(cudaStream_t stream);
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  cudaStream_t stream() const { return stream_; }
  bool recording() const;
  // Starts recording (waits until the device has read the arena's previous contents). Forgets
  // every cached graph when device memory was freed since the last start (MemoryFreed).
  void Start();
  // Device memory the graphs may name is freed: a graph launched over a freed (even reallocated)
  // buffer crashed inside cuGraphLaunch (golden_store_gpu_test, H100, stop 42), so every free of
  // a buffer (the backend's Allocate, a scratch growing) calls this. Any thread.
  static void MemoryFreed();
  // Issues what is recorded and stops recording. Every operation that waits for the stream or
  // runs on it unrecorded calls it first: a step is recorded from its start to its first wait.
  void Stop();

  // Stream operations: recorded while recording, else issued at once on the stream.
  // Host -> device from memory the caller may reuse at once; copy_bytes >= bytes are copied (the
  // bytes past `bytes` are unspecified; dst must hold copy_bytes).
  void CopyFromHost(void* dst, const void* host, size_t bytes, size_t copy_bytes);
  void CopyOnDevice(void* dst, const void* src, size_t bytes);
  void Memset(void* dst, int value, size_t bytes);
  // A kernel launch (from Launch): args[i] points at the i-th parameter, sizes[i] its size.
  void RecordKernel(const void* kernel, const cudaLaunchConfig_t& config, const void* const* args,
                    const size_t* sizes, int count);

  // Fragments issued since creation (CudaBackend::GraphStats).
  const CudaBackend::GraphStats& stats() const { return stats_; }

 private:
  enum class Kind : uint8_t { kKernel, kCopy, kMemset };
  struct Item {
    Kind kind = Kind::kKernel;
    const void* kernel = nullptr;
    dim3 grid, block;
    size_t smem = 0;
    bool programmatic = false;
    int first_arg = 0, num_args = 0;  // in arg_offsets_
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
    cudaMemcpyKind copy_kind = cudaMemcpyDefault;
    int value = 0;
  };
  struct Entry {
    std::vector<unsigned char> signature;
    cudaGraphExec_t exec = nullptr;  // null: seen once, not built yet
    uint64_t last_use = 0;
  };

  // Issues what is recorded so far (as a cached graph, directly, or as a new graph).
  void Flush();
  void Add(const Item& item);
  static Item CopyItem(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
  void Submit(const Item& item);   // recorded while recording, else issued
  void IssueItem(const Item& item);
  template <typename T>
  void Sign(const T& v);
  void Issue();  // items_ onto the stream as they are
  void Forget(Entry& e);
  void ForgetAll();

  cudaStream_t stream_ = nullptr;
  std::vector<Item> items_;
  std::vector<unsigned char> arg_bytes_;  // the recorded arguments, each 16-byte aligned
  std::vector<size_t> arg_offsets_;
  std::vector<void*> argv_;               // Issue's argument pointers
  std::vector<unsigned char> signature_;  // of items_
  size_t fragment_limit_ = 0;
  uint64_t frees_seen_ = 0;  // MemoryFreed's count at the last Start
  // Pinned host memory the recorded host->device copies read from; arena_used_ bytes are taken.
  unsigned char* arena_ = nullptr;
  size_t arena_bytes_ = 0, arena_used_ = 0;
  cudaEvent_t arena_read_ = nullptr;  // after the last copy that reads the arena
  std::unordered_map<uint64_t, Entry> cache_;  // by the signature's hash
  uint64_t clock_ = 0;
  bool capture_failed_ = false;  // a capture failed once: issue directly from then on
  CudaBackend::GraphStats stats_;
};

}  // namespace moe::kernels::cuda
