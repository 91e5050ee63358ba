// The one authorization step every RPC of the API passes (after Kubernetes' authorization
// filter): the handler's first call, before it reads anything of the request but the field
// this names.
//
// What a method does to which resource is data, declared on the method in the .proto with the
// option `(oomb.v1.auth)` (proto/oomb/v1/rules.proto: an action, a resource kind and the
// request's field that names it). The table is built from the services' descriptors when the
// daemon starts; a method without a rule, or whose rule names a field its request lacks, stops
// the start (Authorizer::Create). tests/server/authorization_integration_test.cc enumerates every
// method of every service from the descriptors and calls each over gRPC and over HTTP, without
// credentials and as a caller of another project, and fails on one the table does not cover
// or that answers anything but the refusal below.
//
// The step: authenticate the caller (Authenticator::Authenticate: UNAUTHENTICATED), then by the
// rule:
//   AUTHENTICATED  nothing more (GetServerInfo, GetCaller);
//   CREATE         the project the field names (ProjectOfParent: "" is the caller's only
//                  project; PERMISSION_DENIED for one it may not act in);
//   LIST           as CREATE, but "" and projects/- list every project the caller may act in;
//   READ, WRITE    the job, checkpoint's job or dataset the field names, when it exists and the
//                  caller may act in its project: NOT_FOUND otherwise, the same answer as for
//                  one that does not exist ("no job <name>", "no dataset <name>"). READ and WRITE
//                  are the same check today (a caller acts in a project wholly); the rule says
//                  which one a role would split.
// Errors of the name's shape are INVALID_ARGUMENT naming the field, as the resource name
// parsers word them (proto/spec/resource_names.h). Denials are logged (LogDenied).
//
// Thread-safety: Authorize may be called from any thread; the table does not change.
#ifndef OOMB_SERVER_AUTHORIZATION_H_
#define OOMB_SERVER_AUTHORIZATION_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/server_context.h"
#include "oomb/v1/datasets.pb.h"
#include "oomb/v1/jobs.pb.h"
#include "oomb/v1/rules.pb.h"
#include "server/auth.h"
#include "server/store/job_store.h"

namespace oomb::server {

// What the step found, for the handler: it acts as `caller`, on what this holds.
struct Authorization {
  Caller caller;
  // The project the request acts in: the resource's (READ, WRITE), the one named or implied by
  // the parent (CREATE, LIST of one project); empty for AUTHENTICATED and a LIST of every one.
  std::string project;
  // LIST: the projects to list; nullopt: every project (an administrator's list of all). An
  // empty list: the caller may act in none (the answer is empty).
  std::optional<std::vector<std::string>> list_projects;
  std::optional<v1::Job> job;          // JOB and CHECKPOINT: the job, as stored
  std::optional<v1::Dataset> dataset;  // DATASET: the dataset, as stored
};

class Authorizer {
 public:
  // The API's services: oomb.v1.JobService and oomb.v1.DatasetService.
  static std::vector<const google::protobuf::ServiceDescriptor*> ApiServices();

  // The table of `services`' methods. INVALID_ARGUMENT naming the method when one has no
  // (oomb.v1.auth) rule, an action of ACTION_UNSPECIFIED, no resource or field where its action
  // needs them, a field its request lacks or that is not a string, or a request type another
  // method also takes (the request's type is what selects the rule). `auth` null: every caller
  // is an anonymous administrator. `store` must outlive the authorizer.
  static absl::StatusOr<std::unique_ptr<Authorizer>> Create(
      const Authenticator* auth, JobStore* store,
      const std::vector<const google::protobuf::ServiceDescriptor*>& services);

  // The rule of a method by its full name ("/oomb.v1.JobService/GetJob"); null when it has none.
  const v1::AuthRule* RuleOf(const std::string& full_method) const;

  // The step (see the file comment) for the call `ctx` of the method whose request is `request`
  // (for a client stream: its first message). INTERNAL for a request type no method takes.
  absl::StatusOr<Authorization> Authorize(const grpc::ServerContextBase& ctx,
                                          const google::protobuf::Message& request) const;

 private:
  struct Entry {
    std::string method;  // "/oomb.v1.JobService/GetJob"
    v1::AuthRule rule;
  };
  Authorizer(const Authenticator* auth, JobStore* store) : auth_(auth), store_(store) {}
  // The rule's checks of the resource, once the caller is known.
  absl::Status Check(const Entry& entry, const std::string& value, Authorization* out) const;
  // The job `name` names, when `caller` may act in its project; NOT_FOUND otherwise.
  absl::StatusOr<v1::Job> VisibleJob(const Caller& caller, const std::string& name) const;
  // The dataset `name` names (datasets/{id}: of the caller's only project), likewise.
  absl::StatusOr<v1::Dataset> VisibleDataset(const Caller& caller, const std::string& name) const;

  const Authenticator* const auth_;
  JobStore* const store_;
  std::map<std::string, Entry> by_request_;  // the request's full type name -> its method's rule
  std::map<std::string, const Entry*> by_method_;
};

// The string at `path` (field names joined by '.') of `message`; "" where a message on the way
// is unset. The path is checked when the table is built.
std::string FieldAtPath(const google::protobuf::Message& message, const std::string& path);

}  // namespace oomb::server

#endif  // OOMB_SERVER_AUTHORIZATION_H_
