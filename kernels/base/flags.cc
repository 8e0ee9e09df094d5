// ParseFlags: absl's parser with our --help filter and exit code.
#include "kernels/base/flags.h"

#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"

namespace moe::base {

std::vector<char*> ParseFlags(int argc, char** argv, absl::string_view usage,
                              absl::string_view main_file) {
  absl::SetProgramUsageMessage(usage);
  // absl's default --help lists only flags from a file named like the binary (moe-worker.cc);
  // ours live in the *_main.cc that calls us and the files beside it that it links (the flags
  // moe-worker and moe-generate share: service/main/model_flags.cc). absl hands the filter the
  // flag's __FILE__, possibly without its leading '/', so match the end of the directory.
  const std::string file(absl::StripPrefix(main_file, "/"));
  const std::string dir = file.substr(0, file.rfind('/') + 1);
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [dir](absl::string_view path) {
    const absl::string_view path_dir = path.substr(0, path.rfind('/') + 1);
    return absl::EndsWith(path_dir, dir);
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);

  // Abseil 20220623 exits 1 after printing help; asking for help is not a failure (scripts and
  // tests read the exit code), so the usage flags are handled here. Same calls as
  // absl::ParseCommandLine otherwise.
  std::vector<char*> positional = absl::flags_internal::ParseCommandLineImpl(
      argc, argv, absl::flags_internal::ArgvListAction::kRemoveParsedArgs,
      absl::flags_internal::UsageFlagsAction::kIgnoreUsage,
      absl::flags_internal::OnUndefinedFlag::kAbortIfUndefined);
  if (absl::flags_internal::HandleUsageFlags(std::cout, absl::ProgramUsageMessage()) != -1) {
    std::exit(0);
  }
  return positional;
}

}  // namespace moe::base
