// Logging to stderr; the one line is written with a single call so threads do not interleave.
#include "kernels/base/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace moe::base {
namespace {
std::atomic<int> g_min_level{0};
}

void SetMinLogLevel(LogLevel level) { g_min_level.store(static_cast<int>(level)); }
LogLevel MinLogLevel() { return static_cast<LogLevel>(g_min_level.load()); }

LogMessage::LogMessage(const char* file, int line, LogLevel level) : level_(level) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char when[32];
  std::strftime(when, sizeof(when), "%H:%M:%S", &tm);
  const char* base = std::strrchr(file, '/');
  static constexpr char kLevels[] = {'I', 'W', 'E'};
  stream_ << kLevels[static_cast<int>(level_)] << " " << when << " " << (base ? base + 1 : file)
          << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string line = stream_.str();
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace moe::base
