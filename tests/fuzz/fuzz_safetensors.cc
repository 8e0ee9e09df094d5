// Fuzz target: a safetensors file (8-byte header length, JSON header, data) through
// store::Checkpoint::Open. Every tensor it accepts must lie inside the file and hold exactly
// numel(shape) elements of its dtype.
#include <cstdint>
#include <string>

#include "expertstore/safetensors.h"
#include "kernels/quant.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moe;
  const std::string dir = fuzz::ScratchDir();
  fuzz::WriteFile(dir + "/model.safetensors", std::string(reinterpret_cast<const char*>(data), size));
  auto ckpt = store::Checkpoint::Open(dir);
  if (!ckpt.ok()) return 0;
  for (const auto& [name, info] : (*ckpt)->tensors()) {
    MOE_FUZZ_CHECK(info.offset <= size && info.bytes <= size - info.offset);
    uint64_t numel = 1;
    for (const int64_t d : info.shape) {
      MOE_FUZZ_CHECK(d >= 0);
      MOE_FUZZ_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel));
    }
    if (info.group_size == 0) {
      uint64_t bytes = 0;
      MOE_FUZZ_CHECK(!__builtin_mul_overflow(numel, kernels::DTypeSize(info.dtype), &bytes));
      MOE_FUZZ_CHECK(bytes == info.bytes);
    }
    auto view = (*ckpt)->Get(name);
    MOE_FUZZ_CHECK(view.ok());
  }
  return 0;
}
