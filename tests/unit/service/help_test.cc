// Every binary's --help, run as a process: it exits 0 and lists the flags its main file defines
// (absl's default lists flags only from a file named like the binary, so it printed none).
#include <sys/wait.h>

#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace moe {
namespace {

struct Binary {
  const char* name;
  const char* path;
  std::vector<const char*> flags;  // a few of the flags its --help must list
};

// Test names show the binary, not the struct's bytes.
void PrintTo(const Binary& b, std::ostream* os) { *os << b.name; }

struct ProcessResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

ProcessResult RunCommand(const std::string& command) {
  ProcessResult run;
  FILE* pipe = ::popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.output.append(buffer, n);
  const int status = ::pclose(pipe);
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  return run;
}

class Help : public ::testing::TestWithParam<Binary> {};

TEST_P(Help, ExitsZeroAndListsTheBinarysFlags) {
  const Binary& b = GetParam();
  const ProcessResult run = RunCommand(absl::StrCat(b.path, " --help"));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.output.find("No flags matched"), std::string::npos) << run.output;
  for (const char* flag : b.flags) {
    // absl prints each flag as "    --name (description); default: ...".
    EXPECT_NE(run.output.find(absl::StrCat("--", flag, " (")), std::string::npos)
        << b.name << " --help does not list --" << flag << ":\n"
        << run.output;
  }
  // --help is the binary's own flags; absl's (--flagfile, --helpfull) are for --helpfull.
  EXPECT_EQ(run.output.find("--flagfile ("), std::string::npos) << run.output;
}

TEST_P(Help, UnknownFlagStillFails) {
  const ProcessResult run = RunCommand(absl::StrCat(GetParam().path, " --no_such_flag_anywhere"));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("no_such_flag_anywhere"), std::string::npos) << run.output;
}

INSTANTIATE_TEST_SUITE_P(
    Binaries, Help,
    ::testing::Values(
        Binary{"moe_generate", MOE_GENERATE_BIN, {"model", "max_tokens", "prompt", "backend"}},
        Binary{"moe_worker", MOE_WORKER_BIN, {"model", "listen", "metrics_listen", "kv_budget"}},
        Binary{"moe_frontend", MOE_FRONTEND_BIN,
               {"listen", "workers", "workers_dns", "max_queued"}},
        Binary{"moe_client", MOE_CLIENT_BIN, {"target", "user", "list_models"}},
        Binary{"moe_loadgen", MOE_LOADGEN_BIN, {"target", "concurrency", "duration_seconds"}},
        Binary{"moe_import", MOE_IMPORT_BIN, {"model_dir", "store_dir", "format"}},
        Binary{"moe_store_sim", MOE_STORE_SIM_BIN, {"trace", "budgets", "policies"}},
        Binary{"moe_bench", MOE_BENCH_BIN, {"backend", "layers", "experts"}},
        Binary{"moe_store_bench", MOE_STORE_BENCH_BIN, {"dir", "experts", "format"}},
        Binary{"moe_offline_tokens", MOE_OFFLINE_TOKENS_BIN,
               {"write_default_model", "write_scripted_model", "script", "model", "prompt_ids"}}),
    [](const ::testing::TestParamInfo<Binary>& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace moe
