// ExpertKey: which expert of which layer of which model; its text form goes into every message.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace moe::store {

struct ExpertKey {
  std::string model;
  int32_t layer = 0;
  int32_t expert = 0;

  friend bool operator==(const ExpertKey&, const ExpertKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const ExpertKey& k) {
    return H::combine(std::move(h), k.model, k.layer, k.expert);
  }
  std::string ToString() const {
    return absl::StrCat("expert (layer ", layer, ", expert ", expert, ")");
  }
};

}  // namespace moe::store
