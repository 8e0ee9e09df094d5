// What the published-checkpoint loaders (published_quant.cc, published_f8.cc) share: the error
// for a quantization_config they do not implement, and a tensor shape as text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace moe::store {

// config.json's quantization_config.`key` = `value` is refused, with the reason.
inline absl::Status RefuseQuantConfig(const std::string& key, const nlohmann::json& value,
                                      const std::string& why) {
  return absl::UnimplementedError(
      absl::StrCat("config.json quantization_config.", key, " = ", value.dump(), ": ", why));
}

// "[a,b]"
inline std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

}  // namespace moe::store
