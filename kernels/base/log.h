// MOE_LOG(INFO|WARNING|ERROR) << ...: one line per event to stderr with time, level and file:line.
#pragma once

#include <sstream>

namespace moe::base {

enum class LogLevel { kInfo = 0, kWarning = 1, kError = 2 };

// Messages below this level are dropped. Default: kInfo. Set once at start-up by a main().
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();

class LogMessage {
 public:
  LogMessage(const char* file, int line, LogLevel level);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace moe::base

#define MOE_LOG_LEVEL_INFO ::moe::base::LogLevel::kInfo
#define MOE_LOG_LEVEL_WARNING ::moe::base::LogLevel::kWarning
#define MOE_LOG_LEVEL_ERROR ::moe::base::LogLevel::kError
#define MOE_LOG(level)                                              \
  if (MOE_LOG_LEVEL_##level < ::moe::base::MinLogLevel()) {         \
  } else                                                            \
    ::moe::base::LogMessage(__FILE__, __LINE__, MOE_LOG_LEVEL_##level).stream()
