// moe-store-bench: disk -> host throughput of the blob reader (O_DIRECT, N reads in flight) and
// cold-load throughput of the whole ExpertStore (disk -> host tier -> device tier), on experts of
// a realistic shape written by the real importer from a synthetic bf16 checkpoint.
//
// Bytes counted: blob lengths (4 KiB-padded expert payload + 256 B header), once per read.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "expertstore/blob_index.h"
#include "expertstore/blob_reader.h"
#include "expertstore/expert_store.h"
#include "expertstore/importer.h"
#include "kernels/base/bytes.h"
#include "kernels/base/clock.h"
#include "kernels/base/flags.h"
#include "kernels/quant.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, dir, "/tmp/moe_store_bench", "Scratch directory (checkpoint + store)");
ABSL_FLAG(int32_t, experts, 64, "Experts to write (one layer)");
ABSL_FLAG(int64_t, hidden, 2048, "H (Qwen3-30B-A3B: 2048)");
ABSL_FLAG(int64_t, intermediate, 768, "I (Qwen3-30B-A3B: 768)");
ABSL_FLAG(std::string, format, "int4", "Expert format");
ABSL_FLAG(std::string, io_threads, "8", "Reads in flight; a comma-separated list runs each");
ABSL_FLAG(int32_t, device_slots, -1, "Store run: device tier slots (-1: every expert)");
ABSL_FLAG(int32_t, host_slots, -1, "Store run: host tier slots (-1: every expert)");
ABSL_FLAG(int32_t, warm_passes, 5, "Store run: warm passes after the cold one (every expert in the host tier)");
ABSL_FLAG(bool, o_direct, true, "Read with O_DIRECT");
ABSL_FLAG(std::string, backend, "cpu",
          "Backend of the store's device tier: cpu (memcpy) or cuda (VRAM; host tier pinned when "
          "the backend offers pinned memory)");

namespace {
using namespace moe;

void WriteCheckpoint(const std::string& dir, int32_t experts, int64_t H, int64_t I,
                     store::ImportOptions* o) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  std::vector<std::pair<std::string, uint64_t>> tensors;
  for (int32_t e = 0; e < experts; ++e) {
    const std::string p = absl::StrCat("model.layers.0.mlp.experts.", e, ".");
    o->experts.push_back(
        {0, e, p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"});
    for (const char* w : {"gate_proj", "up_proj", "down_proj"}) {
      const bool down = std::string(w) == "down_proj";
      const uint64_t bytes = static_cast<uint64_t>(H * I * 2);
      header[p + w + ".weight"] = {
          {"dtype", "BF16"},
          {"shape", down ? std::vector<int64_t>{H, I} : std::vector<int64_t>{I, H}},
          {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
    }
  }
  const std::string text = header.dump();
  const uint64_t len = text.size();
  std::ofstream out(dir + "/model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(text.data(), static_cast<std::streamsize>(len));
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.f, 0.02f);
  std::vector<uint16_t> chunk(1 << 20);
  for (uint64_t done = 0; done < offset; done += chunk.size() * 2) {
    for (auto& v : chunk) v = kernels::F32ToBf16(dist(rng));
    out.write(reinterpret_cast<const char*>(chunk.data()),
              static_cast<std::streamsize>(std::min<uint64_t>(chunk.size() * 2, offset - done)));
  }
}

double GBps(uint64_t bytes, double seconds) { return static_cast<double>(bytes) / seconds / 1e9; }

}  // namespace

int main(int argc, char** argv) {
  moe::base::ParseFlags(argc, argv,
      "Measures blob-tier read throughput and store cold-load throughput.",
      __FILE__);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  store::ImportOptions o;
  o.model = "bench";
  o.format = kernels::ParseWeightFormat(absl::GetFlag(FLAGS_format)).value();
  WriteCheckpoint(dir, absl::GetFlag(FLAGS_experts), absl::GetFlag(FLAGS_hidden),
                  absl::GetFlag(FLAGS_intermediate), &o);
  auto ckpt = store::Checkpoint::Open(dir).value();
  const std::string store_dir = dir + "/store";
  double t0 = base::NowSeconds();
  auto imported = store::ImportModel(*ckpt, store_dir, o);
  if (!imported.ok()) {
    std::fprintf(stderr, "%s\n", std::string(imported.status().ToString()).c_str());
    return 1;
  }
  std::printf("import: %ld experts, %s in %.2fs (%.2f GB/s written, quantization included)\n",
              static_cast<long>(imported->imported),
              base::FormatBytes(imported->bytes_written).c_str(), base::NowSeconds() - t0,
              GBps(imported->bytes_written, base::NowSeconds() - t0));

  auto index = store::BlobIndex::Open(store_dir + "/index", "", false).value();
  const std::vector<store::BlobLocation> entries = index->List().value();
  index.reset();
  const uint64_t length = entries[0].length;
  // 1. Blob reader alone: every blob once, io_threads in flight.
  for (absl::string_view threads_text : absl::StrSplit(absl::GetFlag(FLAGS_io_threads), ',')) {
    int io_threads = 8;
    if (!absl::SimpleAtoi(threads_text, &io_threads) || io_threads <= 0) return 1;
    std::vector<void*> buffers;
    for (size_t i = 0; i < entries.size(); ++i) buffers.push_back(std::aligned_alloc(4096, length));
    for (int rep = 0; rep < 3; ++rep) {
      store::BlobReader reader(store_dir, {.io_threads = io_threads,
                                           .verify_checksums = rep != 2,
                                           .use_o_direct = absl::GetFlag(FLAGS_o_direct)});
      std::atomic<int> errors{0};
      t0 = base::NowSeconds();
      {
        std::vector<std::promise<void>> done(entries.size());
        for (size_t i = 0; i < entries.size(); ++i) {
          reader.ReadAsync(entries[i], buffers[i], [&, i](absl::Status s) {
            if (!s.ok()) ++errors;
            done[i].set_value();
          });
        }
        for (auto& d : done) d.get_future().wait();
      }
      const double dt = base::NowSeconds() - t0;
      std::printf(
          "disk->host (blob reader, %d in flight, checksum %s, o_direct %d): %zu x %s in "
          "%.3fs = %.2f GB/s, errors %d\n",
          io_threads, rep != 2 ? "on " : "off", absl::GetFlag(FLAGS_o_direct), entries.size(),
          base::FormatBytes(length).c_str(), dt, GBps(length * entries.size(), dt), errors.load());
    }
    for (void* b : buffers) std::free(b);

    // 2. The whole store: pass 1 cold (disk -> host tier -> device tier), pass 2 with every
    // expert in the host tier. Experts are acquired in batches of the device tier's slot count,
    // so when it holds fewer than all experts each batch of pass 2 evicts the previous one (LRU)
    // and every load is a host hit and a device miss: host -> device alone.
    const bool cuda = absl::GetFlag(FLAGS_backend) == "cuda";
    auto made = kernels::MakeBackend(cuda ? kernels::BackendKind::kCuda : kernels::BackendKind::kCpu, {});
    if (!made.ok()) {
      std::fprintf(stderr, "%s\n", std::string(made.status().ToString()).c_str());
      return 1;
    }
    auto backend = std::move(*made);
    store::StoreOptions so;
    so.store_dir = store_dir;
    const int32_t dslots = absl::GetFlag(FLAGS_device_slots),
                  hslots = absl::GetFlag(FLAGS_host_slots);
    const size_t device_slots = dslots < 0 ? entries.size() : static_cast<size_t>(dslots);
    so.device_budget_bytes = length * device_slots;
    so.host_budget_bytes = length * (hslots < 0 ? entries.size() : static_cast<size_t>(hslots));
    so.io_threads = io_threads;
    so.use_o_direct = absl::GetFlag(FLAGS_o_direct);
    auto es = store::ExpertStore::Open(so, backend.get()).value();
    std::vector<int32_t> all;
    for (const auto& e : entries) all.push_back(e.expert);
    const size_t batch = std::max<size_t>(1, std::min(device_slots, all.size()));
    // Pass 1 cold, then --warm_passes warm ones (each ~8 ms at 128 experts: one is noisy).
    std::vector<double> warm_rates;
    for (int pass = 1; pass <= 1 + absl::GetFlag(FLAGS_warm_passes); ++pass) {
      const store::StoreStats before = es->Stats();
      t0 = base::NowSeconds();
      for (size_t b = 0; b < all.size(); b += batch) {
        const size_t n = std::min(batch, all.size() - b);
        auto handles = es->Acquire(0, absl::MakeConstSpan(all.data() + b, n)).value();
        for (auto& h : handles) {
          if (!h.ready.get().ok()) return 1;
        }
      }
      backend->Synchronize();
      const double dt = base::NowSeconds() - t0;
      const store::StoreStats s = es->Stats();
      const uint64_t host_in = s.host.bytes_in - before.host.bytes_in;
      const uint64_t device_in = s.device.bytes_in - before.device.bytes_in;
      std::printf(
          "store pass %d (%s, %zu device slots, %s host): %s disk->host, %s host->device in "
          "%.3fs = %.2f GB/s into the device tier\n",
          pass, cuda ? "cuda" : "cpu", device_slots, base::FormatBytes(so.host_budget_bytes).c_str(),
          base::FormatBytes(host_in).c_str(), base::FormatBytes(device_in).c_str(), dt,
          GBps(device_in, dt));
      if (pass > 1) warm_rates.push_back(GBps(device_in, dt));
    }
    if (!warm_rates.empty()) {
      std::sort(warm_rates.begin(), warm_rates.end());
      std::printf("store warm passes: median %.2f GB/s, best %.2f GB/s over %zu\n",
                  warm_rates[warm_rates.size() / 2], warm_rates.back(), warm_rates.size());
    }
    // The same pieces host->device back to back from pinned memory, no store in between: what
    // the link gives copies of this size in this run (the store's figure above is held to it).
    if (cuda) {
      const size_t n = std::min<size_t>(all.size(), 64);
      auto host = backend->AllocateHost(n * length).value();
      auto dev = backend->Allocate(n * length).value();
      std::memset(host.data(), 1, n * length);
      double best = 1e30;
      for (int rep = 0; rep < 5; ++rep) {
        t0 = base::NowSeconds();
        for (size_t i = 0; i < n; ++i) {
          backend->CopyToDeviceOnCopyQueue(static_cast<uint8_t*>(dev.data()) + i * length,
                                           static_cast<uint8_t*>(host.data()) + i * length,
                                           length, 0);
        }
        backend->SynchronizeCopies();
        best = std::min(best, base::NowSeconds() - t0);
      }
      std::printf("host->device raw (pinned, %zu x %s back to back, best of 5): %.2f GB/s\n", n,
                  base::FormatBytes(length).c_str(), GBps(n * length, best));
    }
  }
  std::filesystem::remove_all(dir);
  return 0;
}
