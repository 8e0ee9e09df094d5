// ParseFlags: absl flag parsing for our executables, with a --help that lists the binary's flags.
#pragma once

#include <vector>

#include "absl/strings/string_view.h"

namespace moe::base {

// Sets `usage` as the program's usage message, then parses argv like absl::ParseCommandLine.
// --help and --helpshort list the flags defined in the directory of `main_file` (pass __FILE__
// from the file that defines the binary's ABSL_FLAGs; flag files it links from beside it count
// too); --helpfull lists every flag, absl's own included. After
// printing help (or --version, --only_check_args) the process exits 0; an unknown flag or a bad
// value exits 1 with absl's message. Returns the positional arguments, argv[0] first.
// Call once, first thing in main(): it sets process-wide absl state.
std::vector<char*> ParseFlags(int argc, char** argv, absl::string_view usage,
                              absl::string_view main_file);

}  // namespace moe::base
