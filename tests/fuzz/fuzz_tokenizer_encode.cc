// Fuzz target: the built-in model's tokenizer (byte-level BPE trained on the default corpus,
// ChatML specials). Input: text to encode (with and without special tokens), then its bytes
// read as ids to decode, one shot and incrementally. Valid UTF-8 must round-trip up to NFC.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "engine/tokenizer/bpe_trainer.h"
#include "engine/tokenizer/detokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {
const moe::engine::Tokenizer& Tok() {
  static const std::unique_ptr<moe::engine::Tokenizer> tok = [] {
    auto json = moe::engine::TrainTokenizerJson(moe::engine::DefaultCorpus(), 1024,
                                                {"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
    if (!json.ok()) std::abort();
    auto t = moe::engine::Tokenizer::FromJson(*json);
    if (!t.ok()) std::abort();
    return std::move(*t);
  }();
  return *tok;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moe;
  const engine::Tokenizer& tok = Tok();
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const bool allow_special : {true, false}) {
    auto ids = tok.Encode(text, allow_special);
    if (!ids.ok()) continue;
    for (const int32_t id : *ids) MOE_FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
    auto back = tok.Decode(*ids);
    MOE_FUZZ_CHECK(back.ok());
    // Encoding is idempotent on what it decodes to (NFC is, and BPE is deterministic).
    auto again = tok.Encode(*back, allow_special);
    MOE_FUZZ_CHECK(again.ok());
    auto back2 = tok.Decode(*again);
    MOE_FUZZ_CHECK(back2.ok() && *back2 == *back);
  }
  std::vector<int32_t> ids(size / 4);
  if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * 4);
  for (int32_t& id : ids) id = static_cast<int32_t>(static_cast<uint32_t>(id) % (tok.vocab_size() + 8));
  auto once = tok.Decode(ids);
  engine::IncrementalDetokenizer detok(tok);
  std::string streamed;
  bool all_known = true;
  for (const int32_t id : ids) {
    all_known = all_known && tok.TokenBytes(id).has_value();
    if (tok.TokenBytes(id).has_value()) streamed += detok.Push(id);
  }
  streamed += detok.Flush();
  if (all_known) {
    MOE_FUZZ_CHECK(once.ok());
    MOE_FUZZ_CHECK(streamed == *once);
  }
  return 0;
}
