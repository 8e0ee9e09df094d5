// WriteDenseAndManifest: a minimal safetensors writer (header JSON padded to 8 bytes, tensors
// back to back in name order) and the manifest. Dense weights are small next to the experts, so
// they are rewritten on every run rather than resumed.
#include "expertstore/dense_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "expertstore/blob_format.h"
#include "expertstore/manifest.h"
#include "expertstore/safetensors.h"
#include "kernels/base/status.h"
#include "kernels/quant.h"
#include "nlohmann/json.hpp"

namespace moe::store {
namespace {
using nlohmann::json;

const char* SafetensorsDType(kernels::DType t) {
  return t == kernels::DType::kF32 ? "F32" : t == kernels::DType::kF16 ? "F16" : "BF16";
}

// Writes `bytes` to path via path.tmp + fsync + rename + fsync of the directory.
absl::Status WriteFileAtomically(const std::string& path, const std::vector<uint8_t>& bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", tmp, ": ", std::strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("write ", tmp, ": ", std::strerror(err)));
    }
    done += static_cast<size_t>(w);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced) return absl::InternalError(absl::StrCat("fsync ", tmp, ": ", std::strerror(errno)));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename ", tmp, ": ", std::strerror(errno)));
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteDenseSafetensors(const Checkpoint& checkpoint, const std::string& path,
                                   const ImportOptions& options) {
  std::vector<std::string> names = options.dense_tensors;
  std::sort(names.begin(), names.end());
  const absl::flat_hash_set<std::string> keep(options.dense_full_precision.begin(),
                                              options.dense_full_precision.end());
  json header = json::object();
  json quant = json::object();  // name -> {dtype, group_size, shape}: see safetensors.h
  struct Planned {
    kernels::TensorView src;
    kernels::DType dtype;
    uint64_t offset, bytes;
  };
  std::vector<Planned> planned;
  uint64_t offset = 0;
  for (const std::string& name : names) {
    absl::StatusOr<kernels::TensorView> v = checkpoint.Get(name);
    if (!v.ok()) return base::Annotate(v.status(), "dense weights");
    std::vector<int64_t> shape(v->shape.begin(), v->shape.begin() + v->rank);
    // Quantized formats apply to matrices only; vectors (norms, biases) and the tensors the
    // caller keeps (routers) stay in their checkpoint dtype. A tensor already quantized (a
    // published int4 checkpoint) keeps its own bits: re-quantizing would only add error.
    kernels::DType dtype = name == options.lm_head_tensor
                               ? options.lm_head_format.value_or(options.dense_format)
                               : options.dense_format;
    if (kernels::IsQuantized(dtype) && (v->rank != 2 || keep.contains(name))) dtype = v->dtype;
    if (kernels::IsQuantized(v->dtype)) dtype = v->dtype;
    kernels::TensorView out = *v;
    out.dtype = dtype;
    if (!kernels::IsQuantized(v->dtype)) {
      out.group_size = kernels::IsQuantized(dtype) ? options.group_size : 0;
    }
    const uint64_t bytes = out.bytes();
    if (kernels::IsQuantized(dtype)) {
      quant[name] = {
          {"dtype", kernels::DTypeName(dtype)}, {"group_size", out.group_size}, {"shape", shape}};
      shape = {static_cast<int64_t>(bytes)};
    }
    header[name] = {{"dtype", kernels::IsQuantized(dtype) ? "U8" : SafetensorsDType(dtype)},
                    {"shape", shape},
                    {"data_offsets", {offset, offset + bytes}}};
    planned.push_back({*v, dtype, offset, bytes});
    offset += bytes;
  }
  header["__metadata__"] = {{"format", "pt"}, {"model", options.model}};
  if (!quant.empty()) header["__metadata__"][kQuantMetadataKey] = quant.dump();
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<uint8_t> file(8 + text.size() + offset);
  const uint64_t len = text.size();
  std::memcpy(file.data(), &len, 8);
  std::memcpy(file.data() + 8, text.data(), text.size());
  uint8_t* data = file.data() + 8 + text.size();
  for (const Planned& p : planned) {
    if (kernels::IsQuantized(p.src.dtype)) {
      std::memcpy(data + p.offset, p.src.data, p.bytes);
    } else if (kernels::IsQuantized(p.dtype)) {
      absl::StatusOr<kernels::TensorView> q =
          kernels::Quantize(p.src, p.dtype, options.group_size, data + p.offset);
      if (!q.ok()) return base::Annotate(q.status(), "dense weights");
    } else {
      kernels::ConvertDense(p.src, p.dtype, data + p.offset);
    }
  }
  return WriteFileAtomically(path, file);
}

absl::Status WriteDenseAndManifest(const Checkpoint& checkpoint, const std::string& store_dir,
                                   const ImportOptions& options) {
  MOE_RETURN_IF_ERROR(
      WriteDenseSafetensors(checkpoint, absl::StrCat(store_dir, "/dense.safetensors"), options));

  StoreManifest manifest;
  manifest.model = options.model;
  manifest.format_version = kStoreFormatVersion;
  manifest.expert_format = kernels::WeightFormatName(options.format);
  manifest.group_size = kernels::IsQuantized(options.format) ? options.group_size : 0;
  manifest.num_experts = static_cast<int64_t>(options.experts.size());
  manifest.dense_format = kernels::WeightFormatName(options.dense_format);
  manifest.num_dense_tensors = static_cast<int64_t>(options.dense_tensors.size());
  const std::string mtext = ManifestText(manifest);
  return WriteFileAtomically(absl::StrCat(store_dir, "/", kManifestFile),
                             std::vector<uint8_t>(mtext.begin(), mtext.end()));
}

}  // namespace moe::store
