// Fuzz target: tokenizer.json text through engine::Tokenizer::FromJson; an accepted tokenizer
// then encodes and decodes a fixed text and every id it knows without crashing.
#include <cstdint>
#include <string>

#include "engine/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moe;
  auto tok = engine::Tokenizer::FromJson(std::string(reinterpret_cast<const char*>(data), size));
  if (!tok.ok()) return 0;
  auto ids = (*tok)->Encode("Hello, world! <|im_start|>user\n 123 héllo\t\n");
  if (ids.ok()) {
    for (const int32_t id : *ids) MOE_FUZZ_CHECK(id >= 0 && id < (*tok)->vocab_size());
    (void)(*tok)->Decode(*ids);
  }
  for (int64_t id = 0; id < (*tok)->vocab_size() && id < 4096; ++id) {
    (void)(*tok)->Decode({static_cast<int32_t>(id)});
  }
  return 0;
}
