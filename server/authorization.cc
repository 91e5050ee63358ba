#include "server/authorization.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "proto/spec/resource_names.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::MethodDescriptor;
using google::protobuf::ServiceDescriptor;

// Whether `path` names a singular string field of `type`, through singular message fields.
bool IsStringPath(const Descriptor* type, const std::string& path) {
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    const FieldDescriptor* f = type->FindFieldByName(parts[i]);
    if (f == nullptr || f->is_repeated()) return false;
    if (i + 1 == parts.size()) return f->type() == FieldDescriptor::TYPE_STRING;
    if (f->type() != FieldDescriptor::TYPE_MESSAGE) return false;
    type = f->message_type();
  }
  return false;
}

absl::Status CheckRule(const MethodDescriptor& m, const v1::AuthRule& rule) {
  const auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat(m.full_name(), ": its (oomb.v1.auth) rule ", what, " (proto/oomb/v1/rules.proto)"));
  };
  if (!m.options().HasExtension(v1::auth)) return bad("is missing: every method says what it does to which resource");
  if (rule.action() == v1::AuthRule::ACTION_UNSPECIFIED) return bad("has no action");
  if (rule.action() == v1::AuthRule::AUTHENTICATED) {
    if (rule.resource() != v1::AuthRule::RESOURCE_UNSPECIFIED || !rule.field().empty()) {
      return bad("names a resource, which AUTHENTICATED does not check");
    }
    return absl::OkStatus();
  }
  const bool project = rule.resource() == v1::AuthRule::PROJECT;
  const bool in_project = rule.action() == v1::AuthRule::CREATE || rule.action() == v1::AuthRule::LIST;
  if (rule.resource() == v1::AuthRule::RESOURCE_UNSPECIFIED || project != in_project) {
    return bad("pairs its action with the wrong resource (CREATE and LIST take a PROJECT, READ and WRITE a resource)");
  }
  if (!IsStringPath(m.input_type(), rule.field())) {
    return bad(absl::StrCat("names the field '", rule.field(), "', which is no string field of ",
                            m.input_type()->full_name()));
  }
  return absl::OkStatus();
}

}  // namespace

std::string FieldAtPath(const google::protobuf::Message& message, const std::string& path) {
  const google::protobuf::Message* m = &message;
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    const FieldDescriptor* f = m->GetDescriptor()->FindFieldByName(parts[i]);
    if (f == nullptr || f->is_repeated()) return "";
    const google::protobuf::Reflection* r = m->GetReflection();
    if (i + 1 == parts.size()) return f->type() == FieldDescriptor::TYPE_STRING ? r->GetString(*m, f) : "";
    if (f->type() != FieldDescriptor::TYPE_MESSAGE) return "";
    m = &r->GetMessage(*m, f);
  }
  return "";
}

std::vector<const ServiceDescriptor*> Authorizer::ApiServices() {
  return {v1::Job::descriptor()->file()->FindServiceByName("JobService"),
          v1::Dataset::descriptor()->file()->FindServiceByName("DatasetService")};
}

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Create(const Authenticator* auth, JobStore* store,
                                                               const std::vector<const ServiceDescriptor*>& services) {
  std::unique_ptr<Authorizer> a(new Authorizer(auth, store));
  for (const ServiceDescriptor* s : services) {
    for (int i = 0; i < s->method_count(); ++i) {
      const MethodDescriptor& m = *s->method(i);
      const v1::AuthRule& rule = m.options().GetExtension(v1::auth);
      OOMB_RETURN_IF_ERROR(CheckRule(m, rule));
      Entry e{.method = absl::StrCat("/", s->full_name(), "/", m.name()), .rule = rule};
      const std::string& request = m.input_type()->full_name();
      const auto [it, inserted] = a->by_request_.emplace(request, std::move(e));
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(m.full_name(), " takes ", request, " as ", it->second.method,
                                                       " does: each method needs a request type of its own, which "
                                                       "selects its (oomb.v1.auth) rule"));
      }
      a->by_method_[it->second.method] = &it->second;
    }
  }
  return a;
}

const v1::AuthRule* Authorizer::RuleOf(const std::string& full_method) const {
  const auto it = by_method_.find(full_method);
  return it == by_method_.end() ? nullptr : &it->second->rule;
}

absl::StatusOr<Authorization> Authorizer::Authorize(const grpc::ServerContextBase& ctx,
                                                    const google::protobuf::Message& request) const {
  const auto it = by_request_.find(request.GetDescriptor()->full_name());
  if (it == by_request_.end()) {
    return absl::InternalError(
        absl::StrCat("no authorization rule for a method taking ", request.GetDescriptor()->full_name()));
  }
  Authorization out;
  if (auth_ != nullptr) {
    OOMB_ASSIGN_OR_RETURN(out.caller, auth_->Authenticate(ctx));
  }
  const Entry& entry = it->second;
  if (entry.rule.action() == v1::AuthRule::AUTHENTICATED) return out;
  OOMB_RETURN_IF_ERROR(Check(entry, FieldAtPath(request, entry.rule.field()), &out));
  return out;
}

absl::Status Authorizer::Check(const Entry& entry, const std::string& value, Authorization* out) const {
  const Caller& caller = out->caller;
  const v1::AuthRule::Action action = entry.rule.action();
  if (action == v1::AuthRule::LIST && (value.empty() || value == "projects/-")) {
    if (!caller.admin()) out->list_projects = caller.Projects();
    return absl::OkStatus();
  }
  if (action == v1::AuthRule::LIST || action == v1::AuthRule::CREATE) {
    OOMB_ASSIGN_OR_RETURN(out->project, ProjectOfParent(caller, value));
    if (action == v1::AuthRule::LIST) out->list_projects = std::vector<std::string>{out->project};
    return absl::OkStatus();
  }
  const v1::AuthRule::Resource resource = entry.rule.resource();
  if (resource == v1::AuthRule::DATASET) {
    OOMB_ASSIGN_OR_RETURN(out->dataset, VisibleDataset(caller, value));
    out->project = names::ParseDataset(out->dataset->name())->project;
    return absl::OkStatus();
  }
  if (resource == v1::AuthRule::JOB) {
    OOMB_ASSIGN_OR_RETURN(out->job, VisibleJob(caller, value));
  } else if (resource == v1::AuthRule::CHECKPOINT) {
    OOMB_ASSIGN_OR_RETURN(const names::CheckpointName ref, names::ParseCheckpoint(value));
    OOMB_ASSIGN_OR_RETURN(
        out->job,
        VisibleJob(caller, ref.job.project.empty() ? "jobs/" + ref.job.job : names::Job(ref.job.project, ref.job.job)));
  } else {
    return absl::InternalError(absl::StrCat(entry.method, ": a rule Create should have refused"));
  }
  out->project = ParseStoredName(out->job->name()).project;
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> Authorizer::VisibleJob(const Caller& caller, const std::string& name) const {
  OOMB_ASSIGN_OR_RETURN(const names::JobName ref, names::ParseJob(name));
  absl::StatusOr<v1::Job> job = store_->Get(ref.job);
  if (job.ok()) {
    const std::string project = ParseStoredName(job->name()).project;
    if (caller.MayActIn(project) && (ref.project.empty() || ref.project == project)) return job;
    LogDenied(caller, absl::StrCat("a job of project ", project, " (", name, ")"));
  } else if (job.status().code() != absl::StatusCode::kNotFound) {
    return job.status();
  }
  // What the caller may not see does not exist for it.
  return absl::NotFoundError(absl::StrCat("no job ", Excerpt(name)));
}

absl::StatusOr<v1::Dataset> Authorizer::VisibleDataset(const Caller& caller, const std::string& name) const {
  OOMB_ASSIGN_OR_RETURN(names::DatasetName ref, names::ParseDataset(name));
  if (ref.project.empty()) {  // datasets/{id}: of the caller's only project
    OOMB_ASSIGN_OR_RETURN(ref.project, ProjectOfParent(caller, ""));
  }
  if (!caller.MayActIn(ref.project)) {
    LogDenied(caller, absl::StrCat("a dataset of project ", ref.project));
    return absl::NotFoundError(absl::StrCat("no dataset ", Excerpt(name)));
  }
  absl::StatusOr<v1::Dataset> d = store_->GetDataset(names::Dataset(ref.project, ref.dataset));
  if (absl::IsNotFound(d.status())) return absl::NotFoundError(absl::StrCat("no dataset ", Excerpt(name)));
  return d;
}

}  // namespace oomb::server
