// The one place where internal statuses become gRPC statuses (docs/CONVENTIONS.md §6.2). absl and gRPC
// share the canonical code numbering, so the code passes through unchanged; the message is
// the internal message, which by convention names the field, file or state at fault, cut to
// kMaxMessageBytes (worker/common/status.h) so that no client ever receives more than that,
// whatever input it sent.
//
// The details (google.rpc.Status in the grpc-status-details-bin trailer; the HTTP gateway shows
// them as the error's "details"): a google.rpc.ErrorInfo whose reason is the status's Reason
// (ReasonOrDefault, worker/common/status.h; domain "oomb.dev"), and for INVALID_ARGUMENT a
// google.rpc.BadRequest whose field violation names the field the message starts with (messages
// name their field first: "spec: data.train: ..." is the field spec.data.train).
#ifndef OOMB_SERVER_GRPC_STATUS_H_
#define OOMB_SERVER_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace oomb::server {

grpc::Status ToGrpcStatus(const absl::Status& s);

// The dotted field path a message starts with ("spec: data.train: /d/a: ..." -> "spec.data.train");
// empty when it starts with none.
std::string LeadingField(absl::string_view message);

}  // namespace oomb::server

#endif  // OOMB_SERVER_GRPC_STATUS_H_
