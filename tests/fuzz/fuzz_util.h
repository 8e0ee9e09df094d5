// Helpers shared by the libFuzzer targets: splitting one input into parts, and a scratch file.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace moe::fuzz {

// The input split at NUL bytes into at most `n` parts (the last takes the rest), so that seed
// files stay readable: "config.json\0generation_config.json".
inline std::vector<std::string> SplitInput(const uint8_t* data, size_t size, size_t n) {
  std::vector<std::string> parts;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  while (parts.size() + 1 < n) {
    const size_t nul = in.find('\0');
    if (nul == std::string_view::npos) break;
    parts.emplace_back(in.substr(0, nul));
    in.remove_prefix(nul + 1);
  }
  parts.emplace_back(in);
  parts.resize(n);
  return parts;
}

// A directory of this process's own under /dev/shm (memory) or /tmp, made once.
inline const std::string& ScratchDir() {
  static const std::string dir = [] {
    std::string tmpl = access("/dev/shm", W_OK) == 0 ? "/dev/shm/moe_fuzz_XXXXXX"
                                                     : "/tmp/moe_fuzz_XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    return tmpl;
  }();
  return dir;
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// An invariant the code under test broke: abort so that libFuzzer keeps the input.
#define MOE_FUZZ_CHECK(cond)                                                    \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, \
                   __LINE__);                                                   \
      std::abort();                                                             \
    }                                                                           \
  } while (0)

}  // namespace moe::fuzz
