// Byte-level BPE model: merge-rank priority merging of one pre-tokenized word into token ids.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace moe::engine {

class BpeModel {
 public:
  // `vocab`: raw token bytes -> id (byte-level characters already mapped back to bytes).
  // `merges`: (left, right) raw-byte pairs, highest priority first.
  // Returns InvalidArgument when a single byte has no token (byte-level BPE needs all 256), when
  // a merge names a token missing from the vocab, or when its concatenation is missing.
  // `ignore_merges`: a word that is itself in the vocab is emitted whole (HF's ignore_merges).
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(
      const std::vector<std::pair<std::string, int32_t>>& vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges);

  // Appends the ids of `word` (raw bytes, one pre-tokenizer piece) to `out`. Results of short
  // words are cached. Thread-safe.
  void EncodeWord(absl::string_view word, std::vector<int32_t>* out) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  void MergeWord(absl::string_view word, std::vector<int32_t>* out) const;

  std::array<int32_t, 256> byte_ids_{};
  absl::flat_hash_map<uint64_t, Merge> merges_;
  absl::flat_hash_map<std::string, int32_t> vocab_;  // used only with ignore_merges
  bool ignore_merges_ = false;

  // Word -> ids. Text repeats words heavily, so this skips most merging work.
  mutable absl::Mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_ ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace moe::engine
