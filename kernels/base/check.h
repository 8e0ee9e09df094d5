// MOE_CHECK: invariants and programmer errors abort with file:line and a message. Never for input.
#pragma once

#include <cstdlib>
#include <iostream>
#include <sstream>

namespace moe::base {

// Collects the streamed message and aborts in its destructor.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition) {
    stream_ << file << ":" << line << ": check failed: " << condition << " ";
  }
  [[noreturn]] ~CheckFailure() {
    std::cerr << stream_.str() << std::endl;
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

}  // namespace moe::base

#define MOE_CHECK(cond) \
  if (cond) {           \
  } else                \
    ::moe::base::CheckFailure(__FILE__, __LINE__, #cond).stream()

#ifdef NDEBUG
#define MOE_DCHECK(cond) \
  if (true) {            \
  } else                 \
    ::moe::base::CheckFailure(__FILE__, __LINE__, #cond).stream()
#else
#define MOE_DCHECK(cond) MOE_CHECK(cond)
#endif
