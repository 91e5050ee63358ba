// The one place where exceptions become statuses (worker/common/status.h, the error model):
// LibTorch reports failures by throwing, the engine's callers expect statuses.
//
//   c10::OutOfMemoryError, std::bad_alloc   RESOURCE_EXHAUSTED, reason OUT_OF_MEMORY
//   StatusError                             its status, unchanged (code and reason)
//   c10::Error                              INTERNAL, reason CUDA_ERROR when the message says
//                                           CUDA, else TORCH_ERROR (both transient)
//   anything else                           INTERNAL, reason INTERNAL
#ifndef OOMB_WORKER_TRAIN_TORCH_STATUS_H_
#define OOMB_WORKER_TRAIN_TORCH_STATUS_H_

#include <exception>
#include <string_view>

#include "absl/status/status.h"
#include "worker/common/status.h"

namespace oomb {

// The status of the exception `e`, its message prefixed by `what` when not empty.
absl::Status StatusOfException(std::exception_ptr e, std::string_view what = "");

// `f()`, a callable returning absl::Status or absl::StatusOr<T>, with exceptions turned into
// their status.
template <typename F>
auto Guarded(F&& f, std::string_view what = "") -> decltype(f()) {
  try {
    return f();
  } catch (...) {
    return StatusOfException(std::current_exception(), what);
  }
}

}  // namespace oomb

#endif  // OOMB_WORKER_TRAIN_TORCH_STATUS_H_
