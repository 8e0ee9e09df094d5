// Status helpers: propagate absl::Status with context. Debian 12's Abseil ships no status macros.
#pragma once

#include "absl/strings/string_view.h"
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace moe::base {

// Returns `status` with "context: " prepended to its message; OK stays OK.
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace moe::base

#define MOE_STATUS_CONCAT_INNER(a, b) a##b
#define MOE_STATUS_CONCAT(a, b) MOE_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define MOE_RETURN_IF_ERROR(expr)                  \
  do {                                             \
    if (absl::Status _moe_st = (expr); !_moe_st.ok()) { \
      return _moe_st;                              \
    }                                              \
  } while (0)

// `lhs = value of expr` (an absl::StatusOr<T>), or returns its error from the enclosing function.
#define MOE_ASSIGN_OR_RETURN(lhs, expr) \
  MOE_ASSIGN_OR_RETURN_IMPL(MOE_STATUS_CONCAT(_moe_sor_, __LINE__), lhs, expr)
#define MOE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()
