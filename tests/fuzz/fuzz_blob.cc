// Fuzz target: the blob index reader and blob header check. Input, split at a NUL byte: an index
// entry's value (JSON, store::DecodeBlobLocation) and the blob's bytes. An entry that decodes
// and a blob that passes store::VerifyBlob must give gate/up/down views inside the blob's
// `length` bytes (what the expert store hands the kernels).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "expertstore/blob_format.h"
#include "expertstore/blob_index.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moe;
  const std::vector<std::string> parts = fuzz::SplitInput(data, size, 2);
  auto loc = store::DecodeBlobLocation("e/m/00000000/00000000", parts[0], "fuzz/index");
  if (!loc.ok()) return 0;
  if (loc->length < store::kBlobHeaderBytes || loc->length > (1u << 20)) return 0;
  std::unique_ptr<uint8_t[]> blob(new uint8_t[loc->length]());
  std::memcpy(blob.get(), parts[1].data(), std::min<size_t>(parts[1].size(), loc->length));
  // The reader verifies the checksum first; the fuzzer cannot forge XXH3, so check it off.
  if (!store::VerifyBlob(*loc, blob.get(), /*checksum=*/false).ok()) return 0;
  const kernels::ExpertWeights w = store::BlobWeights(*loc, blob.get());
  for (const kernels::TensorView* v : {&w.gate, &w.up, &w.down}) {
    const auto begin = static_cast<const uint8_t*>(v->data) - blob.get();
    MOE_FUZZ_CHECK(begin >= 0 && static_cast<uint64_t>(begin) <= loc->length);
    MOE_FUZZ_CHECK(v->numel() >= 0 && v->bytes() <= loc->length - begin);
  }
  return 0;
}
