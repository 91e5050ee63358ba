// Status helpers shared by every component. Debian's Abseil (20220623) has no status macros,
// so oomb defines its own, prefixed OOMB_.
//
//   OOMB_RETURN_IF_ERROR(expr)        returns the status of `expr` when it is not OK.
//   OOMB_ASSIGN_OR_RETURN(lhs, expr)  evaluates an absl::StatusOr<T> expression; on error
//                                     returns its status, else assigns (or declares) `lhs`.
//
// Errors that cross a component boundary are absl::Status values; exceptions from LibTorch
// are caught at the trainer boundary (worker/train) and turned into statuses there.
#ifndef OOMB_WORKER_COMMON_STATUS_H_
#define OOMB_WORKER_COMMON_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define OOMB_STATUS_CONCAT_INNER_(a, b) a##b
#define OOMB_STATUS_CONCAT_(a, b) OOMB_STATUS_CONCAT_INNER_(a, b)

#define OOMB_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status oomb_status_ = (expr);        \
    if (!oomb_status_.ok()) return oomb_status_; \
  } while (false)

#define OOMB_ASSIGN_OR_RETURN(lhs, expr) \
  OOMB_ASSIGN_OR_RETURN_IMPL_(OOMB_STATUS_CONCAT_(oomb_statusor_, __LINE__), lhs, expr)

#define OOMB_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)   \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

namespace oomb {

// Prefixes a status message with context, keeping the code: "reading config.json: <msg>".
inline absl::Status Annotate(const absl::Status& s, std::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), std::string(context) + ": " + std::string(s.message()));
}

}  // namespace oomb

#endif  // OOMB_WORKER_COMMON_STATUS_H_
