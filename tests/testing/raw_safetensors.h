// Test helpers for checkpoints written byte by byte (the published-format tests): a
// model.safetensors of raw tensors, and a config.json with a quantization_config.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"

namespace moe::testing {

struct RawTensor {
  std::string name, dtype;  // dtype as safetensors spells it ("I32", "F8_E4M3", ...)
  std::vector<int64_t> shape;
  std::string bytes;
};

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// dir/model.safetensors holding `tensors` as given (no check of dtype, shape or size).
inline void WriteSafetensors(const TempDir& dir, const std::vector<RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string payload;
  for (const RawTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {payload.size(), payload.size() + t.bytes.size()}}};
    payload += t.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  dir.Write("model.safetensors",
            std::string(reinterpret_cast<const char*>(&n), 8) + text + payload);
}

// dir/config.json of a qwen3_moe with `quant` as its quantization_config.
inline void WriteQuantConfig(const TempDir& dir, const nlohmann::json& quant) {
  dir.Write("config.json",
            nlohmann::json{{"model_type", "qwen3_moe"}, {"quantization_config", quant}}.dump());
}

}  // namespace moe::testing
