// ExpertStore: the tiered, budgeted cache of expert weights behind store::ExpertProvider.
//
//   Acquire(layer, experts)
//     device tier hit ............ handle ready at once (slot pinned by the handle)
//     device miss ................ claim a device slot (or, when none can be claimed: no
//                                  device tier, all pinned or loading, or the policy declining
//                                  to cache the expert, a bypass, one of a fixed pool of
//                                  transient backend buffers, held by the handle; waits when
//                                  every one is held), then fill it from
//       host tier hit ............ copy host -> device on the copy thread (batched)
//       host miss ................ claim a host slot, read the blob into it on an I/O thread
//                                  (O_DIRECT, checksum verified), then copy it up
//   Handles for misses become ready when their bytes are resident; an error (NotFound,
//   DataLoss, Internal) arrives through the handle's future, naming the expert, file and offset.
//
// Handles always point into backend memory (device slots or transient backend buffers), so the
// engine never needs to know which tier served it. A budget of 0 removes that tier: with both
// at 0 every request reads its blob into a transient buffer.
//
// Thread-safety: every public method is thread-safe. Loads of one expert are never duplicated:
// concurrent requests for an expert that is loading join that load.
// Lifetime: the store must outlive every handle it gave out; destruction waits for loads in
// flight and aborts if a handle is still held (a programmer error).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "expertstore/blob_reader.h"
#include "expertstore/expert_provider.h"
#include "expertstore/host_allocator.h"
#include "expertstore/policy.h"
#include "expertstore/slot_tier.h"
#include "expertstore/stats.h"
#include "expertstore/transient_pool.h"

namespace moe::store {

struct StoreOptions {
  std::string store_dir;  // written by the importer (importer.h); required
  std::string model;      // expected model id; empty accepts the index's. Default: empty.
  uint64_t device_budget_bytes = 0;  // device tier memory; 0 removes the tier. Default: 0.
  uint64_t host_budget_bytes = 0;    // host tier memory; 0 removes the tier. Default: 0.
  PolicyOptions policy;              // eviction policy of both tiers. Default: next_use.
  int io_threads = 8;                // blob reads in flight. Default: 8.
  bool verify_checksums = true;      // Default: true.
  bool use_o_direct = true;          // Default: true.
  // Buffers for loads that find no device slot (TransientPool), allocated on first use and kept.
  // 0: as many as the largest layer has experts, so that one Acquire per layer (the engine's)
  // never waits on itself. Default: 0.
  int transient_buffers = 0;
  // How long an Acquire waits for a transient buffer when every one is held before that
  // expert's handle fails with ResourceExhausted. Default: 30000.
  int64_t transient_wait_ms = 30000;

  // InvalidArgument naming the field.
  absl::Status Validate() const;
};

class ExpertStore final : public ExpertProvider {
 public:
  // Opens the store at options.store_dir for `backend` (which must outlive the store).
  // host_allocator: the host tier's memory; null means the backend's host memory
  // (Backend::AllocateHost: pinned on CUDA), or plain 4 KiB-aligned memory without a backend.
  // NotFound: no index in store_dir. FailedPrecondition: the index is for another model or store
  // format version, holds no experts, or a non-zero budget is smaller than one expert (the
  // message names the budget and the expert size). ResourceExhausted: a budget cannot be
  // allocated. InvalidArgument: bad options.
  static absl::StatusOr<std::unique_ptr<ExpertStore>> Open(
      const StoreOptions& options, kernels::Backend* backend,
      std::unique_ptr<HostAllocator> host_allocator = nullptr);
  ~ExpertStore() override;

  // ExpertProvider. InvalidArgument for a layer outside [0, num_layers()); an expert the index
  // does not hold gets a handle whose future is NotFound. The misses that find no device slot
  // take their transient buffers together; when fewer are free, Acquire waits (store unlocked)
  // up to transient_wait_ms for them (StoreStats::transient_waits), then their handles' futures
  // are ResourceExhausted (transient_exhausted), as are those of a call that needs more buffers
  // than the pool has. A caller that holds transient handles while it calls Acquire again may
  // wait on itself until then.
  absl::StatusOr<std::vector<ExpertHandle>> Acquire(int32_t layer,
                                                    absl::Span<const int32_t> experts) override;

  // Starts loading experts that are not resident into the top tier, without handles; counted as
  // prefetch_issued, and as prefetch_used when a later Acquire finds them. Never evicts a pinned
  // slot; experts that find no slot are dropped (prefetch_dropped).
  void Prefetch(int32_t layer, absl::Span<const int32_t> experts);

  // The experts of `layer` (ids below num_experts) ready in the device tier now, each pinned by
  // its handle; the others are left out. What a decode step may run before it knows its routing
  // (engine/model.cc). Neither counted in the stats nor a use for the eviction policy: Acquire is,
  // for the experts a step uses. Empty for a layer outside [0, num_layers()).
  std::vector<ExpertHandle> PinDeviceResident(int32_t layer, int32_t num_experts);

  // Where the backend can read each expert of a layer now (PinReadable).
  struct ReadableLayer {
    // [num_experts]: the expert's device-tier slot, else its host-tier slot when the backend
    // reads host-tier memory in place; gate.data null when neither holds it ready.
    std::vector<kernels::ExpertWeights> views;
    std::vector<bool> in_host;  // [num_experts]: views[e] is in the host tier
    // Holds the host slots of `views` (a blob read must not overwrite bytes a queued kernel
    // reads); reset it once the work that reads them is done.
    std::shared_ptr<void> host_pins;
    uint64_t version = 0;   // ReadableVersion when made
    bool complete() const;  // every expert readable
  };
  // For a decode step that leaves its routing on the device (engine/model.cc): every expert of
  // `layer` (ids below num_experts) in the device tier, else in the host tier when that is the
  // backend's own memory (Backend::AllocateHost: pinned on CUDA, read by the GPU over PCIe; not
  // with a caller's HostAllocator). Device slots are not pinned: a load into a device slot
  // evicted later is queued behind the compute queued before the eviction (Backend::
  // MarkCompute), so a kernel queued now reads the bytes it was given. Neither
  // counted in the stats nor a use for the policy (Use is). An expert in neither tier starts
  // loading into a free host slot (counted as a prefetch; nothing is evicted for it), so that a
  // host tier that can hold the model fills up. Empty for a layer out of range.
  ReadableLayer PinReadable(int32_t layer, int32_t num_experts);
  // Changes whenever an expert of `layer` becomes ready in, or leaves, either tier: a
  // ReadableLayer whose version is this is still what PinReadable would return.
  uint64_t ReadableVersion(int32_t layer) const;
  // What Acquire does for the experts a step used (stats, the policy's recency, loads of the
  // misses into the device tier), without handles: the loads run on, and a miss that finds every
  // device slot pinned or loading is not loaded. Ids the index lacks are ignored. `from_host`:
  // those of them the step read from the host tier (StoreStats::host_reads).
  void Use(int32_t layer, absl::Span<const int32_t> experts,
           absl::Span<const int32_t> from_host);

  // Loads every expert of the index into the device tier when that tier holds them all, layer by
  // layer, waiting for each layer's loads; `progress(layers_done)` after each. Then every decode
  // step can route on the device from its first (kReadable, engine/moe_layer.h), where a tier
  // filled on demand leaves layers incomplete, and host-routed, for as long as some expert was
  // never used. The loads count as device misses. Returns the experts loaded: 0 (and nothing
  // done) without a device tier of that size. The first load error, naming the expert and file.
  absl::StatusOr<int64_t> Preload(const std::function<void(int32_t layers_done)>& progress);

  StoreStats Stats() const;
  int32_t num_layers() const { return num_layers_; }
  // Size of one slot: the largest blob in the index.
  uint64_t slot_bytes() const { return slot_bytes_; }
  const std::string& model() const { return model_; }

 private:
  struct Transient;
  // Where a load lands: a device slot, or a transient backend buffer.
  struct Target {
    int device_slot = -1;
    std::shared_ptr<Transient> transient;
    // A device slot's copy waits for the compute queued before the slot was claimed (which may
    // still read its old expert), not for the compute queued since (Backend::MarkCompute).
    uint64_t after_mark = 0;
  };
  struct CopyJob {
    void* dst;
    const void* src;
    uint64_t bytes;
    uint64_t after_mark;
    std::function<void()> after;  // runs under mu_ once the copy is complete
  };

  ExpertStore(const StoreOptions& options, kernels::Backend* backend);

  // All of these run with mu_ held.
  // Acquire for one expert; with hold false (Use) no pin, no handle and no transient buffer.
  // With hold, a miss that finds no device slot returns an empty handle (ready not valid):
  // AcquireTransients fills it.
  ExpertHandle AcquireLocked(int32_t layer, int32_t expert, bool hold);
  // Loads handles[i] for each i in `need` into transient buffers, taken together (waiting with
  // `lock` released if need be, see Acquire), or fails them.
  void AcquireTransients(std::unique_lock<std::mutex>& lock, const std::vector<size_t>& need,
                         std::vector<ExpertHandle>* handles);
  uint64_t ReadableVersionLocked(int32_t layer) const;
  // Tells both tiers' policies that `layer` uses `experts` now (Acquire, Use).
  void BeginVisit(int32_t layer, absl::Span<const int32_t> experts);
  void FillFromBelow(const BlobLocation& loc, const Target& target);
  void ReadIntoHostSlot(const BlobLocation& loc, int host_slot);
  void EnqueueCopy(const void* src, const BlobLocation& loc, const Target& target,
                   std::function<void()> after);
  void FinishTarget(const Target& target, const absl::Status& status);
  void* TargetData(const Target& target) const;
  ExpertHandle SlotHandle(const BlobLocation& loc, int device_slot);

  void DrainCopies();  // on the copy thread
  void Release(int device_slot);
  static void RunWaiters(std::vector<std::function<void(absl::Status)>> waiters,
                         const absl::Status& status);

  const StoreOptions options_;
  kernels::Backend* const backend_;
  std::unique_ptr<HostAllocator> host_allocator_;
  bool host_readable_ = false;  // the host tier is the backend's memory (PinReadable)
  std::string model_;
  int32_t num_layers_ = 0;
  uint64_t slot_bytes_ = 0;
  absl::flat_hash_map<ExpertId, BlobLocation> locations_;  // immutable after Open

  mutable std::mutex mu_;
  StoreStats stats_;                   // guarded by mu_
  std::unique_ptr<SlotTier> device_;   // null when its budget is 0; guarded by mu_
  std::unique_ptr<SlotTier> host_;     // likewise
  std::unique_ptr<TransientPool> transient_;  // its own lock (a leaf)
  std::vector<CopyJob> copy_queue_;    // guarded by mu_
  bool copy_drain_scheduled_ = false;  // guarded by mu_

  // Reset in this order by the destructor: reads finish (and queue their copies), then copies.
  std::unique_ptr<base::ThreadPool> copy_thread_;
  std::unique_ptr<BlobReader> reader_;
};

}  // namespace moe::store
