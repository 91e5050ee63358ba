#include "worker/train/torch_status.h"

#include <c10/util/Exception.h>

#include <new>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace oomb {

absl::Status StatusOfException(std::exception_ptr e, std::string_view what) {
  const std::string prefix = what.empty() ? "" : absl::StrCat(std::string(what), ": ");
  try {
    std::rethrow_exception(e);
  } catch (const StatusError& s) {
    return what.empty() ? s.status() : Annotate(s.status(), std::string(what));
  } catch (const c10::OutOfMemoryError& oom) {
    return WithReason(absl::ResourceExhaustedError(absl::StrCat(prefix, oom.what_without_backtrace())),
                      Reason::kOutOfMemory);
  } catch (const c10::Error& err) {
    const std::string text = err.what_without_backtrace();
    return WithReason(absl::InternalError(prefix + text),
                      absl::StrContains(text, "CUDA") ? Reason::kCudaError : Reason::kTorchError);
  } catch (const std::bad_alloc&) {
    return WithReason(absl::ResourceExhaustedError(prefix + "host allocation failed"), Reason::kOutOfMemory);
  } catch (const std::exception& other) {
    return WithReason(absl::InternalError(prefix + other.what()), Reason::kInternal);
  } catch (...) {
    return WithReason(absl::InternalError(prefix + "unknown exception"), Reason::kInternal);
  }
}

}  // namespace oomb
