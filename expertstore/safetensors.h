// Memory-mapped reader for Hugging Face safetensors checkpoints, single file or sharded
// (model.safetensors.index.json). The engine and the importer both read weights through it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"

namespace moe::store {

// One mapped file. Move-only; unmaps on destruction.
class MappedFile {
 public:
  // NotFound when the file does not exist; Internal for other mmap/open failures.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

// Our extension for quantized matrices (kernels/quant.h) in a safetensors file, as written by the
// importer for dense weights: the tensor is stored as dtype "U8", shape [bytes], and
// __metadata__[kQuantMetadataKey] is a JSON string {name: {"dtype": "Q8"|"Q4"|"Q2",
// "group_size": G, "shape": [rows, cols]}}. Readers without the extension see plain bytes.
inline constexpr char kQuantMetadataKey[] = "moe.quant";

struct TensorInfo {
  std::string name;
  kernels::DType dtype;
  std::vector<int64_t> shape;  // the logical shape (of the matrix, for quantized tensors)
  int32_t group_size = 0;      // quantized tensors only
  const MappedFile* file = nullptr;
  uint64_t offset = 0;  // absolute, in file
  uint64_t bytes = 0;
  // Set for a tensor repacked at load from a published quantized layout (published_quant.cc):
  // its bytes, owned by the Checkpoint (file and offset then name the source's qweight).
  const uint8_t* data = nullptr;
};

// All tensors of a checkpoint directory, by name. The views stay valid while this object lives.
class Checkpoint {
 public:
  // Opens `dir`/model.safetensors.index.json if present, else every `dir`/*.safetensors.
  // NotFound: no safetensors in dir, or a shard named by the index is missing.
  // DataLoss: a truncated file, a header whose offsets lie outside the file or do not match the
  // shape and dtype. InvalidArgument: malformed header JSON or index. Unimplemented: a dtype other
  // than F32/F16/BF16 (or U8 with our quantization metadata, above). Messages name the file and
  // the tensor. Names are normalised (safetensors.cc: NormalizeNames): a vision-language
  // checkpoint's text model under "model.", fused 3-D experts as per-expert views.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  bool Has(const std::string& name) const { return tensors_.count(name) != 0; }
  // NotFound names the tensor; InvalidArgument when its shape is not `expected_shape`
  // (an empty expected shape accepts any).
  absl::StatusOr<kernels::TensorView> Get(const std::string& name,
                                          const std::vector<int64_t>& expected_shape = {}) const;
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }

 private:
  static absl::StatusOr<std::unique_ptr<Checkpoint>> OpenFiles(const std::string& dir);
  absl::Status AddFile(const std::string& path);
  absl::Status NormalizeNames();
  // config.json's quantization_config (published_quant.cc): the quantized modules of a GPTQ,
  // AWQ or compressed-tensors checkpoint become tensors "X.weight", kQ4 (symmetric int4) or the
  // exact kQ8 of asymmetric int4, an fp8 one kF8; anything else is refused.
  absl::Status RepackPublishedQuant(const std::string& dir);
  // The fp8 ones (published_f8.cc): quant_method fp8 (block-scaled e4m3) and compressed-tensors
  // float-quantized, into kF8. `config_text` is the quantization_config as JSON text.
  static bool IsPublishedF8(const std::string& config_text);
  absl::Status RepackPublishedF8(const std::string& dir, const std::string& config_text);
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorInfo> tensors_;
  std::vector<std::vector<uint8_t>> repacked_;  // the bytes of the tensors with TensorInfo::data
  // Tensors of an integer or fp8 dtype ("I32", "I64", "F8_E4M3", ...): no kernel reads them; a
  // published quantized layout consumes them (RepackPublishedQuant), any left over is refused.
  struct RawTensor {
    std::string dtype;
    std::vector<int64_t> shape;
    const uint8_t* data = nullptr;
    uint64_t bytes = 0;
  };
  std::map<std::string, RawTensor> raw_;
};

// A tensor to write: `data` holds numel(shape) elements of `dtype`, row-major.
struct TensorToWrite {
  std::string name;
  kernels::DType dtype = kernels::DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes one safetensors file (header padded to 8 bytes, tensors in the order given), to
// `path`.tmp and renamed into place, so a crash never leaves a half-written file under `path`.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace moe::store
