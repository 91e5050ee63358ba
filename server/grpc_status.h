// The one place where internal statuses become gRPC statuses (docs/CONVENTIONS.md §6.2). absl and gRPC
// share the canonical code numbering, so the code passes through unchanged; the message is
// the internal message, which by convention names the field, file or state at fault, cut to
// kMaxMessageBytes (worker/common/status.h) so that no client ever receives more than that,
// whatever input it sent.
#ifndef OOMB_SERVER_GRPC_STATUS_H_
#define OOMB_SERVER_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"
#include "worker/common/status.h"

namespace oomb::server {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code())), BoundedText(s.message()));
}

}  // namespace oomb::server

#endif  // OOMB_SERVER_GRPC_STATUS_H_
