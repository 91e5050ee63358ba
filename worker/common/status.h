// Status helpers shared by every component: the project's status macros (Debian's Abseil,
// 20220623, has none) and the error model.
//
//   OOMB_RETURN_IF_ERROR(expr)        returns the status of `expr` when it is not OK.
//   OOMB_ASSIGN_OR_RETURN(lhs, expr)  evaluates an absl::StatusOr<T> expression; on error
//                                     returns its status, else assigns (or declares) `lhs`.
//
// The error model. A failure is an absl::Status: a canonical code (what kind of failure, the
// API's contract), a message (for people; never parsed) and, where the cause is known, a
// Reason carried as the status's payload: stable data that decides whether the scheduler
// retries a job and what JobError.reason says. Exceptions (LibTorch's c10::Error, bad_alloc,
// StatusError) become statuses in exactly one place, StatusOfException
// (worker/train/torch_status.h), at the boundaries of the engine's work.
#ifndef OOMB_WORKER_COMMON_STATUS_H_
#define OOMB_WORKER_COMMON_STATUS_H_

#include <exception>
#include <optional>
#include <string>
#include <utility>
#include "absl/strings/string_view.h"

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

// Why a job failed, as data. The names (ReasonName) are the API's JobError.reason values and
// stable. `transient`: a retry may succeed (the scheduler retries up to resources.max_retries).
enum class Reason {
  kBadSpec,             // a spec field is invalid (INVALID_ARGUMENT)
  kBadData,             // a dataset line is invalid, or the data has nothing to train on
  kBadModel,            // the model's files are missing, corrupt or of an unsupported architecture
  kPathDenied,          // a path is outside the allowed roots, in the data dir, or through a link
  kCheckpointDirTaken,  // checkpoint.dir belongs to another job
  kNanLoss,             // the loss became NaN or infinite
  kOutOfMemory,         // the device or host allocator failed (CUDA OOM, bad_alloc)
  kDoesNotFit,          // the KV pages the plan allowed are exhausted (a planner/engine mismatch)
  kDiskFull,            // ENOSPC / EDQUOT while writing
  kMaxRuntime,          // resources.max_runtime_seconds passed
  kCudaError,           // a CUDA runtime error other than out of memory (transient)
  kTorchError,          // LibTorch raised an error (transient: it may be the device)
  kPeerFailed,          // another rank of a data-parallel run failed (transient)
  kInternal,            // anything else unexpected (transient)
};

// "BAD_SPEC", "NAN_LOSS", ...
absl::string_view ReasonName(Reason reason);
std::optional<Reason> ParseReason(absl::string_view name);
bool IsTransient(Reason reason);

// `status` with `reason` attached (a payload: survives copies and Annotate). OK stays OK.
absl::Status WithReason(absl::Status status, Reason reason);
// The attached reason, if any.
std::optional<Reason> ReasonOf(const absl::Status& status);
// The attached reason, else one the code implies: INVALID_ARGUMENT and FAILED_PRECONDITION
// BAD_SPEC, PERMISSION_DENIED PATH_DENIED, RESOURCE_EXHAUSTED OUT_OF_MEMORY, DEADLINE_EXCEEDED
// MAX_RUNTIME, anything else INTERNAL. What JobError.reason says; never empty.
Reason ReasonOrDefault(const absl::Status& status);
// Whether a failed run should be retried: by its reason when it has one, else by its code
// (INTERNAL, UNKNOWN, UNAVAILABLE, ABORTED, DATA_LOSS, DEADLINE_EXCEEDED).
bool IsRetryable(const absl::Status& status);

// A status thrown through code that can only throw (LibTorch's autograd calling a backward):
// the boundary that catches it (StatusOfException) returns `status()` unchanged.
class StatusError : public std::exception {
 public:
  explicit StatusError(absl::Status status) : status_(std::move(status)), what_(status_.ToString()) {}
  const absl::Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  absl::Status status_;
  std::string what_;
};

// Prefixes a status message with context, keeping the code and the payloads:
// "reading config.json: <msg>".
absl::Status Annotate(const absl::Status& s, absl::string_view context);

// At most `max_bytes` of `text`, printable: control characters and invalid UTF-8 escaped
// (\n, \x01), and an ending "... (N more bytes)" when cut. For every message or stored string
// that holds input (dataset lines, names, values).
std::string Excerpt(absl::string_view text, size_t max_bytes = 80);

// `s` with its message cut to at most `max_bytes` (Excerpt's marker included), code and
// payloads kept: what may reach a client or the job store.
inline constexpr size_t kMaxMessageBytes = 1024;
absl::Status Bounded(const absl::Status& s, size_t max_bytes = kMaxMessageBytes);
std::string BoundedText(absl::string_view text, size_t max_bytes = kMaxMessageBytes);

}  // namespace oomb

#endif  // OOMB_WORKER_COMMON_STATUS_H_
