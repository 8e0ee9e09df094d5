// Checkpoint: parse each file's header (u64 little-endian length + JSON), validate every entry
// against the file size before any tensor is handed out.
#include "expertstore/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/base/status.h"
#include "kernels/quant.h"
#include "nlohmann/json.hpp"

namespace moe::store {
namespace fs = std::filesystem;
using nlohmann::json;

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::InternalError(absl::StrCat(path, ": open: ", std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": stat: ", std::strerror(err)));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* data = nullptr;
  if (size > 0) {
    data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat(path, ": mmap: ", std::strerror(err)));
    }
  }
  ::close(fd);
  return std::unique_ptr<MappedFile>(new MappedFile(path, static_cast<const uint8_t*>(data), size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

namespace {

// Bytes per element of the dtypes kept aside as Checkpoint::RawTensor; 0 for any other.
uint64_t RawDTypeSize(const std::string& s) {
  if (s == "I64") return 8;
  if (s == "I32") return 4;
  if (s == "I16") return 2;
  if (s == "I8" || s == "U8" || s == "F8_E4M3" || s == "F8_E5M2") return 1;
  return 0;
}

absl::StatusOr<kernels::DType> ParseDType(const std::string& s, const std::string& where) {
  if (s == "F32") return kernels::DType::kF32;
  if (s == "F16") return kernels::DType::kF16;
  if (s == "BF16") return kernels::DType::kBF16;
  return absl::UnimplementedError(
      absl::StrCat(where, ": dtype ", s, " is not supported (F32, F16, BF16)"));
}

}  // namespace

absl::Status Checkpoint::AddFile(const std::string& path) {
  MOE_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  if (file->size() < 8) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: ", file->size(),
                                            " bytes, shorter than the 8-byte header length"));
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, file->data(), 8);  // little-endian on every machine we build for
  if (header_len > file->size() - 8) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: header claims ", header_len,
                                            " bytes but the file has ", file->size()));
  }
  json header;
  try {
    header = json::parse(file->data() + 8, file->data() + 8 + header_len);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not JSON: ", e.what()));
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not a JSON object"));
  }
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file->size() - data_start;
  json quant = json::object();
  if (header.contains("__metadata__") && header["__metadata__"].is_object() &&
      header["__metadata__"].contains(kQuantMetadataKey)) {
    try {
      quant = json::parse(header["__metadata__"][kQuantMetadataKey].get<std::string>());
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": metadata '", kQuantMetadataKey, "' is not JSON: ", e.what()));
    }
  }
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = absl::StrCat(path, ": tensor '", name, "'");
    try {
      TensorInfo info;
      info.name = name;
      const bool quantized = quant.contains(name);
      if (quantized && entry.at("dtype").get<std::string>() != "U8") {
        return absl::InvalidArgumentError(absl::StrCat(where, ": quantized but not stored as U8"));
      }
      const std::string dtype = entry.at("dtype").get<std::string>();
      const uint64_t raw_size = quantized ? 0 : RawDTypeSize(dtype);
      if (!quantized && raw_size == 0) {
        MOE_ASSIGN_OR_RETURN(info.dtype, ParseDType(dtype, where));
      }
      uint64_t numel = 1;
      for (const auto& d : (quantized ? quant[name].at("shape") : entry.at("shape"))) {
        const int64_t v = d.get<int64_t>();
        if (v < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": negative dimension"));
        info.shape.push_back(v);
        // A wrapped product could match data_offsets (fuzz_safetensors: [2^32, 2^32] in 0 bytes).
        if (__builtin_mul_overflow(numel, static_cast<uint64_t>(v), &numel) ||
            numel / 4 > data_size) {  // 4: the most elements a byte holds (Q2)
          return absl::DataLossError(absl::StrCat(where, ": dimension ", v, " makes more elements",
                                                  " than the ", data_size, " data bytes hold"));
        }
      }
      uint64_t want_bytes = numel * (raw_size > 0 ? raw_size : kernels::DTypeSize(info.dtype));
      if (quantized) {
        const std::string q = quant[name].at("dtype").get<std::string>();
        info.dtype = q == "Q8"   ? kernels::DType::kQ8
                     : q == "Q4" ? kernels::DType::kQ4
                     : q == "Q2" ? kernels::DType::kQ2
                     : q == "F8" ? kernels::DType::kF8
                                 : kernels::DType::kF32;
        info.group_size = quant[name].at("group_size").get<int32_t>();
        if (absl::Status st = kernels::ValidateQuantFormat(info.dtype, info.group_size);
            !st.ok() || info.shape.size() != 2) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": bad quantization metadata ", quant[name].dump()));
        }
        want_bytes = kernels::QuantizedBytes(info.dtype, info.shape[0], info.shape[1],
                                             info.group_size);
      }
      const auto& offsets = entry.at("data_offsets");
      if (!offsets.is_array() || offsets.size() != 2) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": data_offsets is not [begin, end]"));
      }
      const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
      if (begin > end || end > data_size) {
        return absl::DataLossError(absl::StrCat(where, ": data_offsets [", begin, ", ", end,
                                                ") outside the ", data_size,
                                                " data bytes (truncated file?)"));
      }
      info.bytes = end - begin;
      if (info.bytes != want_bytes) {
        return absl::DataLossError(absl::StrCat(where, ": ", info.bytes, " bytes for ", numel,
                                                " elements of ", kernels::DTypeName(info.dtype)));
      }
      info.file = file.get();
      info.offset = data_start + begin;
      if (tensors_.count(name) || raw_.count(name)) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": tensor appears in two files"));
      }
      if (raw_size > 0) {
        raw_.emplace(name, RawTensor{dtype, info.shape, file->data() + info.offset, info.bytes});
      } else {
        tensors_.emplace(name, std::move(info));
      }
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": malformed entry: ", e.what()));
    }
  }
  files_.push_back(std::move(file));
  return absl::OkStatus();
}

// Two Hugging Face layouts become the names every reader uses (architectures.md §0.4):
// a vision-language checkpoint's text model ("model.language_model.X" -> "model.X"; the vision
// tower "model.visual.*" and the multi-token-prediction head "mtp.*" are dropped), and fused 3-D
// experts ("P.experts.gate_up_proj" [E, 2I, H] with the gate rows first, "P.experts.down_proj"
// [E, H, I]) become views "P.experts.{e}.gate_proj.weight" [I, H], "...up_proj.weight" [I, H],
// "...down_proj.weight" [H, I] of the same bytes.
absl::Status Checkpoint::NormalizeNames() {
  std::map<std::string, TensorInfo> out;
  auto add = [&](std::string name, TensorInfo info) -> absl::Status {
    info.name = name;
    if (!out.emplace(std::move(name), std::move(info)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", info.name, "' appears twice (under two prefixes or layouts)"));
    }
    return absl::OkStatus();
  };
  constexpr std::string_view kText = "model.language_model.";
  for (auto& [original, info] : tensors_) {
    std::string name = original;
    if (name.rfind("model.visual.", 0) == 0 || name.rfind("mtp.", 0) == 0) continue;
    if (name.rfind(kText, 0) == 0) name = absl::StrCat("model.", name.substr(kText.size()));
    const bool gate_up = absl::EndsWith(name, ".experts.gate_up_proj");
    const bool down = absl::EndsWith(name, ".experts.down_proj");
    if (!gate_up && !down) {
      MOE_RETURN_IF_ERROR(add(std::move(name), std::move(info)));
      continue;
    }
    if (info.shape.size() != 3 || kernels::IsQuantized(info.dtype) ||
        (gate_up && info.shape[1] % 2 != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", original, "' in ", info.file->path(), " has shape [",
          absl::StrJoin(info.shape, ","), "]: fused experts must be [E, 2I, H] or [E, H, I]"));
    }
    const std::string prefix = name.substr(0, name.rfind('.') + 1);  // "P.experts."
    const int64_t E = info.shape[0], rows = info.shape[1], cols = info.shape[2];
    const uint64_t expert_bytes = info.bytes / E;
    for (int64_t e = 0; e < E; ++e) {
      TensorInfo view = info;
      view.offset = info.offset + e * expert_bytes;
      if (down) {
        view.bytes = expert_bytes;
        view.shape = {rows, cols};
        MOE_RETURN_IF_ERROR(add(absl::StrCat(prefix, e, ".down_proj.weight"), view));
        continue;
      }
      view.bytes = expert_bytes / 2;
      view.shape = {rows / 2, cols};
      MOE_RETURN_IF_ERROR(add(absl::StrCat(prefix, e, ".gate_proj.weight"), view));
      view.offset += view.bytes;
      MOE_RETURN_IF_ERROR(add(absl::StrCat(prefix, e, ".up_proj.weight"), view));
    }
  }
  tensors_ = std::move(out);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  MOE_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, OpenFiles(dir));
  MOE_RETURN_IF_ERROR(ckpt->RepackPublishedQuant(dir));
  if (!ckpt->raw_.empty()) {
    const auto& [name, raw] = *ckpt->raw_.begin();
    return absl::UnimplementedError(
        absl::StrCat(dir, ": tensor '", name, "': dtype ", raw.dtype,
                     " is not supported (F32, F16, BF16; integer tensors only as the packed "
                     "weights of a quantization_config the engine implements)"));
  }
  MOE_RETURN_IF_ERROR(ckpt->NormalizeNames());
  return ckpt;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::OpenFiles(const std::string& dir) {
  auto ckpt = std::unique_ptr<Checkpoint>(new Checkpoint());
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    std::ifstream in(index_path);
    json index;
    try {
      index = json::parse(in);
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": not valid JSON: ", e.what()));
    }
    if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": no weight_map object"));
    }
    std::set<std::string> shards;
    for (const auto& [name, shard] : index["weight_map"].items()) {
      if (!shard.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path.string(), ": weight_map['", name, "'] is not a file name"));
      }
      shards.insert(shard.get<std::string>());
    }
    for (const std::string& shard : shards) {
      MOE_RETURN_IF_ERROR(ckpt->AddFile((fs::path(dir) / shard).string()));
    }
    for (const auto& [name, shard] : index["weight_map"].items()) {
      if (!ckpt->Has(name) && !ckpt->raw_.count(name)) {
        return absl::DataLossError(absl::StrCat(index_path.string(), ": tensor '", name,
                                                "' is not in its shard ", shard.get<std::string>()));
      }
    }
    return ckpt;
  }
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path().string());
  }
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": cannot list directory: ", ec.message()));
  if (files.empty()) return absl::NotFoundError(absl::StrCat(dir, ": no *.safetensors files"));
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) MOE_RETURN_IF_ERROR(ckpt->AddFile(f));
  return ckpt;
}

absl::StatusOr<kernels::TensorView> Checkpoint::Get(
    const std::string& name, const std::vector<int64_t>& expected_shape) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return absl::NotFoundError(absl::StrCat("tensor '", name, "' is missing"));
  const TensorInfo& info = it->second;
  if (!expected_shape.empty() && info.shape != expected_shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' in ", info.file->path(), " has shape [", absl::StrJoin(info.shape, ","),
        "], expected [", absl::StrJoin(expected_shape, ","), "]"));
  }
  if (info.shape.size() > 4) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has rank > 4"));
  }
  kernels::TensorView v;
  v.data = info.data != nullptr ? info.data : info.file->data() + info.offset;
  v.dtype = info.dtype;
  v.group_size = info.group_size;
  v.rank = static_cast<int>(info.shape.size());
  for (int i = 0; i < v.rank; ++i) v.shape[i] = info.shape[i];
  return v;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  json header = json::object();
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    const uint64_t bytes = numel * kernels::DTypeSize(t.dtype);
    header[t.name] = {{"dtype", kernels::DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_len = text.size();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&header_len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const TensorToWrite& t : tensors) {
      uint64_t numel = 1;
      for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
      out.write(static_cast<const char*>(t.data),
                static_cast<std::streamsize>(numel * kernels::DTypeSize(t.dtype)));
    }
    if (!out.good()) return absl::InternalError(absl::StrCat(tmp, ": write failed"));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat(path, ": rename: ", ec.message()));
  return absl::OkStatus();
}

}  // namespace moe::store
