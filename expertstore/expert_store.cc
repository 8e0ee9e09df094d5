// ExpertStore: one mutex guards both tiers and the stats; blob reads run on the reader's I/O
// threads and host->device copies on one copy thread that takes every queued copy at once, issues
// them on the backend's copy queue (a CUDA stream of its own) and waits once per batch.
#include "expertstore/expert_store.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "expertstore/blob_index.h"
#include "kernels/base/bytes.h"
#include "kernels/base/clock.h"
#include "kernels/base/status.h"

namespace moe::store {

// A load that found no device slot: one of the pool's buffers, returned to it when the last
// handle (and the load itself) is done with it.
struct ExpertStore::Transient {
  TransientPool* pool = nullptr;
  int index = -1;
  void* data = nullptr;
  ~Transient() {
    if (index >= 0) pool->Release(index);
  }
  std::promise<absl::Status> promise;
  std::shared_future<absl::Status> ready;
  int64_t start_us = 0;
};

namespace {

std::shared_future<absl::Status> Failed(absl::Status status) {
  std::promise<absl::Status> p;
  p.set_value(std::move(status));
  return p.get_future().share();
}

absl::StatusOr<kernels::Buffer> AllocateStaging(uint64_t bytes) {
  void* p = std::aligned_alloc(kBlobAlignment, AlignUp(bytes, kBlobAlignment));
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("staging buffer: cannot allocate ", base::FormatBytes(bytes)));
  }
  return kernels::Buffer(p, bytes, [](void* q) { std::free(q); });
}

absl::Status CheckBudget(const char* tier, uint64_t budget, uint64_t slot_bytes,
                         const BlobLocation& largest) {
  if (budget == 0 || budget >= slot_bytes) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      tier, " budget ", budget, " bytes (", base::FormatBytes(budget),
      ") is smaller than one expert: ", ExpertName(largest.layer, largest.expert), " in ",
      largest.file, " takes ", slot_bytes, " bytes; use 0 to remove the tier"));
}

}  // namespace

absl::Status StoreOptions::Validate() const {
  if (store_dir.empty()) return absl::InvalidArgumentError("store: store_dir is empty");
  if (io_threads <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("store: io_threads ", io_threads, " <= 0"));
  }
  if (transient_buffers < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("store: transient_buffers ", transient_buffers, " < 0"));
  }
  if (transient_wait_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("store: transient_wait_ms ", transient_wait_ms, " < 0"));
  }
  return absl::OkStatus();
}

ExpertStore::ExpertStore(const StoreOptions& options, kernels::Backend* backend)
    : options_(options), backend_(backend) {}

absl::StatusOr<std::unique_ptr<ExpertStore>> ExpertStore::Open(
    const StoreOptions& options, kernels::Backend* backend,
    std::unique_ptr<HostAllocator> host_allocator) {
  MOE_RETURN_IF_ERROR(options.Validate());
  MOE_ASSIGN_OR_RETURN(std::unique_ptr<BlobIndex> index,
                       BlobIndex::Open(options.store_dir + "/index", options.model, false));
  MOE_ASSIGN_OR_RETURN(std::vector<BlobLocation> entries, index->List());
  if (entries.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("store ", options.store_dir, ": the index holds no experts"));
  }
  auto store = std::unique_ptr<ExpertStore>(new ExpertStore(options, backend));
  store->model_ = index->manifest().model;
  if (host_allocator != nullptr) {
    store->host_allocator_ = std::move(host_allocator);
  } else if (backend != nullptr) {
    store->host_allocator_ = MakeBackendHostAllocator(backend);  // pinned on CUDA
    store->host_readable_ = true;
  } else {
    store->host_allocator_ = MakeAlignedHostAllocator();
  }
  const BlobLocation* largest = &entries[0];
  absl::flat_hash_map<int32_t, int> experts_per_layer;
  int most_experts = 0;
  for (const BlobLocation& l : entries) {
    if (l.length > largest->length) largest = &l;
    store->num_layers_ = std::max(store->num_layers_, l.layer + 1);
    most_experts = std::max(most_experts, ++experts_per_layer[l.layer]);
  }
  store->slot_bytes_ = largest->length;  // the largest, so any slot holds any expert
  MOE_RETURN_IF_ERROR(
      CheckBudget("device", options.device_budget_bytes, store->slot_bytes_, *largest));
  MOE_RETURN_IF_ERROR(CheckBudget("host", options.host_budget_bytes, store->slot_bytes_, *largest));
  for (BlobLocation& l : entries) store->locations_[ExpertId{l.layer, l.expert}] = std::move(l);

  const uint64_t slot = store->slot_bytes_;
  PolicyOptions policy_options = options.policy;  // with the index's shape (next_use needs it)
  policy_options.num_layers = store->num_layers_;
  for (const auto& [id, loc] : store->locations_) {
    policy_options.num_experts = std::max(policy_options.num_experts, id.expert + 1);
  }
  if (options.device_budget_bytes > 0) {
    const int64_t n = static_cast<int64_t>(options.device_budget_bytes / slot);
    MOE_ASSIGN_OR_RETURN(kernels::Buffer memory, backend->Allocate(n * slot));
    MOE_ASSIGN_OR_RETURN(std::unique_ptr<EvictionPolicy> policy, MakePolicy(policy_options));
    store->device_ = std::make_unique<SlotTier>("device", std::move(memory), slot, n,
                                                std::move(policy), &store->stats_.device);
  }
  if (options.host_budget_bytes > 0) {
    const int64_t n = static_cast<int64_t>(options.host_budget_bytes / slot);
    MOE_ASSIGN_OR_RETURN(kernels::Buffer memory, store->host_allocator_->Allocate(n * slot));
    MOE_ASSIGN_OR_RETURN(std::unique_ptr<EvictionPolicy> policy, MakePolicy(policy_options));
    store->host_ = std::make_unique<SlotTier>("host", std::move(memory), slot, n, std::move(policy),
                                              &store->stats_.host);
  }
  store->transient_ = std::make_unique<TransientPool>(
      backend, slot,
      options.transient_buffers > 0 ? options.transient_buffers : most_experts);
  store->copy_thread_ = std::make_unique<base::ThreadPool>(1);
  store->reader_ = std::make_unique<BlobReader>(
      options.store_dir, BlobReaderOptions{.io_threads = options.io_threads,
                                           .verify_checksums = options.verify_checksums,
                                           .use_o_direct = options.use_o_direct});
  return store;
}

ExpertStore::~ExpertStore() {
  // The I/O threads first: a finished read enqueues a copy, so the copy thread must outlive them.
  reader_.reset();
  copy_thread_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  MOE_CHECK(!device_ || device_->pinned_slots() == 0)
      << "ExpertStore destroyed while " << device_->pinned_slots() << " device slots are held";
  MOE_CHECK(!host_ || host_->pinned_slots() == 0)
      << "ExpertStore destroyed while " << host_->pinned_slots() << " host slots are held";
}

absl::StatusOr<std::vector<ExpertHandle>> ExpertStore::Acquire(int32_t layer,
                                                               absl::Span<const int32_t> experts) {
  if (layer < 0 || layer >= num_layers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Acquire: layer ", layer, " outside [0, ", num_layers_, ")"));
  }
  std::vector<ExpertHandle> handles;
  handles.reserve(experts.size());
  std::unique_lock<std::mutex> lock(mu_);
  BeginVisit(layer, experts);
  std::vector<size_t> need;  // misses that found no device slot
  for (const int32_t e : experts) {
    handles.push_back(AcquireLocked(layer, e, true));
    if (!handles.back().ready.valid()) need.push_back(handles.size() - 1);
  }
  if (!need.empty()) AcquireTransients(lock, need, &handles);
  return handles;
}

void ExpertStore::Use(int32_t layer, absl::Span<const int32_t> experts,
                      absl::Span<const int32_t> from_host) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.host_reads += from_host.size();
  for (const int32_t e : from_host) {
    const int d = device_ ? device_->Find(ExpertId{layer, e}) : -1;
    if (d < 0) continue;
    ++(device_->slot(d).state == SlotState::kLoading ? stats_.host_reads_loading
                                                      : stats_.host_reads_loaded);
  }
  BeginVisit(layer, experts);
  for (const int32_t e : experts) AcquireLocked(layer, e, false);
}

void ExpertStore::BeginVisit(int32_t layer, absl::Span<const int32_t> experts) {
  if (device_) device_->BeginVisit(layer, experts);
  if (host_) host_->BeginVisit(layer, experts);
}

void ExpertStore::AcquireTransients(std::unique_lock<std::mutex>& lock,
                                    const std::vector<size_t>& need,
                                    std::vector<ExpertHandle>* handles) {
  const int n = std::min<int>(static_cast<int>(need.size()), transient_->capacity());
  absl::StatusOr<std::vector<int>> buffers;
  absl::StatusOr<std::optional<std::vector<int>>> now = transient_->TryTake(n);
  if (!now.ok()) {
    buffers = now.status();
  } else if (now->has_value()) {
    buffers = std::move(**now);
  } else {
    ++stats_.transient_waits;
    // Unlocked: the loads of the handles that will release buffers complete under mu_.
    lock.unlock();
    buffers = transient_->Take(n, absl::Milliseconds(options_.transient_wait_ms));
    lock.lock();
  }
  for (size_t k = 0; k < need.size(); ++k) {
    ExpertHandle& h = (*handles)[need[k]];
    absl::Status error = buffers.status();
    if (buffers.ok() && static_cast<int>(k) >= n) {
      error = absl::ResourceExhaustedError(absl::StrCat(
          "one Acquire needs ", need.size(), " transient buffers, more than the pool's ",
          transient_->capacity(), " (StoreOptions::transient_buffers)"));
    }
    if (!error.ok()) {
      if (absl::IsResourceExhausted(error)) ++stats_.transient_exhausted;
      h.ready = Failed(base::Annotate(error, ExpertName(h.layer, h.expert)));
      continue;
    }
    const BlobLocation& loc = locations_.at(ExpertId{h.layer, h.expert});
    ++stats_.transient_loads;
    auto t = std::make_shared<Transient>();
    t->pool = transient_.get();
    t->index = (*buffers)[k];
    t->data = transient_->data(t->index);
    t->ready = t->promise.get_future().share();
    t->start_us = base::NowMicros();
    FillFromBelow(loc, Target{-1, t});
    auto* weights = new kernels::ExpertWeights(BlobWeights(loc, t->data));
    h.ready = t->ready;
    h.weights = std::shared_ptr<const kernels::ExpertWeights>(
        weights, [t](const kernels::ExpertWeights* w) { delete w; });
  }
  stats_.transient_buffers = static_cast<uint64_t>(transient_->allocated());
}

ExpertHandle ExpertStore::AcquireLocked(int32_t layer, int32_t e, bool hold) {
  const ExpertId id{layer, e};
  auto loc_it = locations_.find(id);
  if (loc_it == locations_.end()) {
    return ExpertHandle{layer, e,
                        Failed(absl::NotFoundError(absl::StrCat(
                            ExpertName(layer, e), " is not in the index of ", options_.store_dir))),
                        nullptr};
  }
  const BlobLocation& loc = loc_it->second;
  if (device_) {
    if (const int d = device_->Find(id); d >= 0) {
      Slot& slot = device_->slot(d);
      ++stats_.device.hits;
      if (slot.state == SlotState::kLoading) ++stats_.joined;
      if (slot.prefetched) {
        ++stats_.prefetch_used;
        slot.prefetched = false;
      }
      device_->Touch(d);
      if (!hold) return {};
      device_->Pin(d);
      return SlotHandle(loc, d);
    }
    ++stats_.device.misses;
    if (const int d = device_->Claim(id, base::NowMicros()); d >= 0) {
      if (hold) device_->Pin(d);
      FillFromBelow(loc, Target{d, nullptr, backend_->MarkCompute()});
      return hold ? SlotHandle(loc, d) : ExpertHandle{};
    }
  }
  if (!hold) return {};
  // No device tier, every device slot pinned or loading, or the policy declined to cache it
  // (EvictionPolicy::Admit): a pool buffer held by the handle, taken with the call's other such
  // misses (AcquireTransients).
  return ExpertHandle{layer, e, {}, nullptr};
}

void ExpertStore::Prefetch(int32_t layer, absl::Span<const int32_t> experts) {
  std::lock_guard<std::mutex> lock(mu_);
  if (device_) device_->Predict(layer, experts);
  if (host_) host_->Predict(layer, experts);
  for (const int32_t e : experts) {
    const ExpertId id{layer, e};
    auto loc_it = locations_.find(id);
    if (loc_it == locations_.end()) continue;
    SlotTier* top = device_ ? device_.get() : host_.get();
    if (top == nullptr) {
      ++stats_.prefetch_dropped;
      continue;
    }
    if (top->Find(id) >= 0) continue;
    const int s = top->Claim(id, base::NowMicros());
    if (s < 0) {
      ++stats_.prefetch_dropped;
      continue;
    }
    ++stats_.prefetch_issued;
    top->slot(s).prefetched = true;
    if (top == device_.get()) {
      FillFromBelow(loc_it->second, Target{s, nullptr, backend_->MarkCompute()});
    } else {
      ++stats_.host.misses;
      ReadIntoHostSlot(loc_it->second, s);
    }
  }
}

std::vector<ExpertHandle> ExpertStore::PinDeviceResident(int32_t layer, int32_t num_experts) {
  std::vector<ExpertHandle> handles;
  if (layer < 0 || layer >= num_layers_) return handles;
  std::lock_guard<std::mutex> lock(mu_);
  if (!device_) return handles;
  for (int32_t e = 0; e < num_experts; ++e) {
    const ExpertId id{layer, e};
    const int d = device_->Find(id);
    if (d < 0 || device_->slot(d).state != SlotState::kReady) continue;
    device_->Pin(d);
    handles.push_back(SlotHandle(locations_.at(id), d));
  }
  return handles;
}

bool ExpertStore::ReadableLayer::complete() const {
  return std::all_of(views.begin(), views.end(),
                     [](const kernels::ExpertWeights& w) { return w.gate.data != nullptr; });
}

ExpertStore::ReadableLayer ExpertStore::PinReadable(int32_t layer, int32_t num_experts) {
  ReadableLayer r;
  if (layer < 0 || layer >= num_layers_) return r;
  r.views.resize(num_experts);
  r.in_host.resize(num_experts);
  std::vector<int> host_slots;
  std::lock_guard<std::mutex> lock(mu_);
  r.version = ReadableVersionLocked(layer);
  for (int32_t e = 0; e < num_experts; ++e) {
    const ExpertId id{layer, e};
    auto loc = locations_.find(id);
    if (loc == locations_.end()) continue;
    if (const int d = device_ ? device_->Find(id) : -1;
        d >= 0 && device_->slot(d).state == SlotState::kReady) {
      r.views[e] = BlobWeights(loc->second, device_->data(d));
      continue;
    }
    if (!host_ || !host_readable_) continue;
    const int h = host_->Find(id);
    if (h >= 0 && host_->slot(h).state == SlotState::kReady) {
      host_->Pin(h);
      host_slots.push_back(h);
      r.views[e] = BlobWeights(loc->second, host_->data(h));
      r.in_host[e] = true;
    } else if (h < 0 && (!device_ || device_->Find(id) < 0) && host_->has_free_slot()) {
      // Into a free host slot only: making a table is not a use, so it evicts nothing (Use,
      // after the step, decides what stays).
      const int s = host_->Claim(id, base::NowMicros());
      ++stats_.prefetch_issued;
      ++stats_.host.misses;
      host_->slot(s).prefetched = true;
      ReadIntoHostSlot(loc->second, s);
    }
  }
  if (!host_slots.empty()) {
    r.host_pins = std::shared_ptr<void>(nullptr, [this, slots = std::move(host_slots)](void*) {
      std::lock_guard<std::mutex> unpin_lock(mu_);
      for (const int h : slots) host_->Unpin(h);
    });
  }
  return r;
}

uint64_t ExpertStore::ReadableVersion(int32_t layer) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ReadableVersionLocked(layer);
}

uint64_t ExpertStore::ReadableVersionLocked(int32_t layer) const {
  return (device_ ? device_->layer_changes(layer) : 0) + (host_ ? host_->layer_changes(layer) : 0);
}

ExpertHandle ExpertStore::SlotHandle(const BlobLocation& loc, int d) {
  auto* weights = new kernels::ExpertWeights(BlobWeights(loc, device_->data(d)));
  return ExpertHandle{loc.layer, loc.expert, device_->slot(d).ready,
                      std::shared_ptr<const kernels::ExpertWeights>(
                          weights, [this, d](const kernels::ExpertWeights* w) {
                            delete w;
                            Release(d);
                          })};
}

// Takes mu_: the store never drops a handle while it holds mu_.
void ExpertStore::Release(int d) {
  std::lock_guard<std::mutex> lock(mu_);
  device_->Unpin(d);
}

void ExpertStore::FillFromBelow(const BlobLocation& loc, const Target& target) {
  const ExpertId id{loc.layer, loc.expert};
  if (host_) {
    int h = host_->Find(id);
    bool claimed = false;
    if (h >= 0) {
      ++stats_.host.hits;
      Slot& slot = host_->slot(h);
      if (slot.prefetched) {
        ++stats_.prefetch_used;
        slot.prefetched = false;
      }
      host_->Touch(h);
    } else {
      ++stats_.host.misses;
      h = host_->Claim(id, base::NowMicros());
      // The read completes under mu_, which is held here: the waiter below is in place first.
      if (h >= 0) ReadIntoHostSlot(loc, h);
      claimed = h >= 0;
    }
    if (h >= 0) {
      host_->Pin(h);  // until copied up
      auto copy_up = [this, loc, target, h](const absl::Status& status) {
        // Runs under mu_.
        if (!status.ok()) {
          host_->Unpin(h);
          FinishTarget(target, status);
          return;
        }
        EnqueueCopy(host_->data(h), loc, target, [this, h] { host_->Unpin(h); });
      };
      Slot& slot = host_->slot(h);
      if (slot.state == SlotState::kReady) {
        copy_up(absl::OkStatus());
      } else {
        if (!claimed) ++stats_.joined;
        slot.waiters.push_back([this, copy_up](absl::Status status) {
          std::lock_guard<std::mutex> lock(mu_);
          copy_up(status);
        });
      }
      return;
    }
  }
  // No host slot to stage in: read into a buffer of its own, then copy up.
  // Plain aligned memory, not the tier allocator: that one prefaults (and, pinned, is slow to
  // allocate), which pays only for memory that stays.
  // On CUDA this buffer is pageable, so its copy runs below pinned speed (a pool of pinned
  // staging buffers would fix that; not built: the path is taken only when every host slot is
  // pinned by in-flight loads, or with a zero host budget).
  absl::StatusOr<kernels::Buffer> staging = AllocateStaging(loc.length);
  if (!staging.ok()) {
    FinishTarget(target, base::Annotate(staging.status(), ExpertName(loc.layer, loc.expert)));
    return;
  }
  auto buffer = std::make_shared<kernels::Buffer>(std::move(*staging));
  ++stats_.blob_reads;
  reader_->ReadAsync(loc, buffer->data(), [this, loc, target, buffer](absl::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.blob_bytes_read += status.ok() ? loc.length : 0;
    if (!status.ok()) {
      ++stats_.blob_errors;
      FinishTarget(target, status);
      return;
    }
    EnqueueCopy(buffer->data(), loc, target, [buffer] {});
  });
}

void ExpertStore::ReadIntoHostSlot(const BlobLocation& loc, int h) {
  ++stats_.blob_reads;
  reader_->ReadAsync(loc, host_->data(h), [this, loc, h](absl::Status status) {
    std::vector<std::function<void(absl::Status)>> waiters;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (status.ok()) {
        stats_.blob_bytes_read += loc.length;
        stats_.host.bytes_in += loc.length;
      } else {
        ++stats_.blob_errors;
      }
      waiters = host_->Complete(h, status);
    }
    // Outside mu_: each waiter takes mu_ itself (FillFromBelow's copy_up).
    RunWaiters(std::move(waiters), status);
  });
}

void ExpertStore::EnqueueCopy(const void* src, const BlobLocation& loc, const Target& target,
                              std::function<void()> after) {
  copy_queue_.push_back(CopyJob{TargetData(target), src, loc.length, target.after_mark,
                                [this, target, bytes = loc.length, after = std::move(after)] {
                                  after();
                                  if (target.device_slot >= 0) stats_.device.bytes_in += bytes;
                                  FinishTarget(target, absl::OkStatus());
                                }});
  if (!copy_drain_scheduled_) {
    copy_drain_scheduled_ = true;
    copy_thread_->Schedule([this] { DrainCopies(); });
  }
}

void ExpertStore::DrainCopies() {
  std::vector<CopyJob> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(copy_queue_);
    copy_drain_scheduled_ = false;
  }
  // Issued and waited for without mu_: Acquire, Use and the I/O threads' completions take mu_ and
  // must not queue behind a copy.
  std::vector<uint64_t> numbers;
  numbers.reserve(batch.size());
  for (const CopyJob& job : batch) {
    numbers.push_back(
        backend_->CopyToDeviceOnCopyQueue(job.dst, job.src, job.bytes, job.after_mark));
  }
  // Each load is ready as soon as its own copy is done, not when the batch is: a decode step
  // that starts meanwhile (its host running ahead of the GPU) then finds the early layers' loads
  // in VRAM instead of reading them from the host tier again (PinReadable).
  for (size_t i = 0; i < batch.size(); ++i) {
    backend_->WaitForCopy(numbers[i]);
    std::lock_guard<std::mutex> lock(mu_);
    batch[i].after();
  }
}

void* ExpertStore::TargetData(const Target& target) const {
  return target.device_slot >= 0 ? device_->data(target.device_slot)
                                 : target.transient->data;
}

void ExpertStore::FinishTarget(const Target& target, const absl::Status& status) {
  if (target.device_slot >= 0) {
    Slot& slot = device_->slot(target.device_slot);
    stats_.load_latency_us.Add(base::NowMicros() - slot.load_start_us);
    // Nobody queues work behind a device slot; its handles wait on the future.
    const auto none = device_->Complete(target.device_slot, status);
    MOE_CHECK(none.empty()) << "device slot with waiters";
    return;
  }
  stats_.load_latency_us.Add(base::NowMicros() - target.transient->start_us);
  target.transient->promise.set_value(status);
}

void ExpertStore::RunWaiters(std::vector<std::function<void(absl::Status)>> waiters,
                             const absl::Status& status) {
  for (auto& w : waiters) w(status);
}

absl::StatusOr<int64_t> ExpertStore::Preload(
    const std::function<void(int32_t layers_done)>& progress) {
  std::vector<std::vector<int32_t>> experts(num_layers_);  // [layer]: ids in the index
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!device_ || device_->num_slots() < static_cast<int64_t>(locations_.size())) return 0;
    for (const auto& [id, loc] : locations_) experts[id.layer].push_back(id.expert);
  }
  int64_t loaded = 0;
  for (int32_t layer = 0; layer < num_layers_; ++layer) {
    std::sort(experts[layer].begin(), experts[layer].end());
    MOE_ASSIGN_OR_RETURN(const std::vector<ExpertHandle> handles, Acquire(layer, experts[layer]));
    for (const ExpertHandle& h : handles) MOE_RETURN_IF_ERROR(h.ready.get());
    loaded += static_cast<int64_t>(handles.size());
    if (progress) progress(layer + 1);
  }
  return loaded;
}

StoreStats ExpertStore::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace moe::store
