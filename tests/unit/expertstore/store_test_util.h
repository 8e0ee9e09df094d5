// Test helpers for expertstore/: a tiny synthetic MoE checkpoint written as safetensors (and
// tests/testing's TempDir under this namespace).
#pragma once


#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "expertstore/importer.h"
#include "kernels/backend.h"
#include "kernels/tensor.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"

namespace moe::store::testing {

using ::moe::testing::TempDir;

struct TinyModel {
  int32_t layers = 3;
  int32_t experts = 4;
  int64_t hidden = 64;        // H
  int64_t intermediate = 32;  // I
};

inline std::string ExpertTensor(int32_t l, int32_t e, const char* which) {
  return absl::StrCat("model.layers.", l, ".mlp.experts.", e, ".", which, "_proj.weight");
}

// Writes dir/model.safetensors with every expert's gate/up/down (random bf16, seeded by name)
// and two dense tensors; returns the import spec for it.
inline ImportOptions WriteTinyCheckpoint(const std::string& dir, const TinyModel& m) {
  using nlohmann::json;
  ImportOptions options;
  options.model = "tiny-moe";
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
  for (int32_t l = 0; l < m.layers; ++l) {
    for (int32_t e = 0; e < m.experts; ++e) {
      ExpertTensorNames n{l, e, ExpertTensor(l, e, "gate"), ExpertTensor(l, e, "up"),
                          ExpertTensor(l, e, "down")};
      tensors.push_back({n.gate, {m.intermediate, m.hidden}});
      tensors.push_back({n.up, {m.intermediate, m.hidden}});
      tensors.push_back({n.down, {m.hidden, m.intermediate}});
      options.experts.push_back(n);
    }
  }
  tensors.push_back({"model.embed_tokens.weight", {16, m.hidden}});
  tensors.push_back({"model.norm.weight", {m.hidden}});
  options.dense_tensors = {"model.embed_tokens.weight", "model.norm.weight"};
  json header = json::object();
  std::vector<uint16_t> data;
  for (const auto& [name, shape] : tensors) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const uint64_t begin = data.size() * 2;
    std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>()(name)));
    std::normal_distribution<float> dist(0.f, 0.05f);
    for (int64_t i = 0; i < n; ++i) data.push_back(kernels::F32ToBf16(dist(rng)));
    header[name] = {
        {"dtype", "BF16"}, {"shape", shape}, {"data_offsets", {begin, data.size() * 2}}};
  }
  std::string text = header.dump();
  const uint64_t len = text.size();
  std::ofstream out(dir + "/model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.write(reinterpret_cast<const char*>(data.data()),
            static_cast<std::streamsize>(data.size() * 2));
  return options;
}

// Overwrites `bytes` bytes of `path` at `offset` with `value`.
inline void Scribble(const std::string& path, uint64_t offset, uint64_t bytes, uint8_t value) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  std::vector<char> fill(bytes, static_cast<char>(value));
  f.write(fill.data(), static_cast<std::streamsize>(bytes));
}

}  // namespace moe::store::testing

namespace moe::store::testing {

// A tiny model imported into dir/store; keeps the checkpoint open to compare against.
struct ImportedTiny {
  TinyModel model;
  ImportOptions import;
  std::unique_ptr<Checkpoint> checkpoint;
  std::string store_dir;
};

inline ImportedTiny ImportTiny(const std::string& dir, uint64_t max_blob_file_bytes = 1 << 30,
                               kernels::DType format = kernels::DType::kBF16) {
  ImportedTiny t;
  t.import = WriteTinyCheckpoint(dir, t.model);
  t.import.max_blob_file_bytes = max_blob_file_bytes;
  t.import.format = format;
  t.checkpoint = std::move(Checkpoint::Open(dir)).value();
  t.store_dir = dir + "/store";
  absl::StatusOr<ImportResult> r = ImportModel(*t.checkpoint, t.store_dir, t.import);
  if (!r.ok()) std::abort();
  return t;
}

// True when the weights behind `w` are byte-for-byte the checkpoint's (bf16 imports).
inline bool SameAsCheckpoint(const Checkpoint& ckpt, const kernels::ExpertWeights& w, int32_t layer,
                             int32_t expert) {
  const std::pair<const kernels::TensorView*, const char*> parts[] = {
      {&w.gate, "gate"}, {&w.up, "up"}, {&w.down, "down"}};
  for (const auto& [view, which] : parts) {
    absl::StatusOr<kernels::TensorView> src = ckpt.Get(ExpertTensor(layer, expert, which));
    if (!src.ok() || src->bytes() != view->bytes() ||
        std::memcmp(src->data, view->data, src->bytes()) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace moe::store::testing
