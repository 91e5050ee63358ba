#include "server/projects.h"

#include <yaml-cpp/yaml.h>

#include <spdlog/spdlog.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proto/spec/resource_names.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

// A project's endpoint: {url, secret_file, events}, as a job spec's notifications.webhooks[].
absl::StatusOr<v1::WebhookSpec> ParseWebhook(const YAML::Node& node) {
  if (!node.IsMap()) return absl::InvalidArgumentError("expected a mapping {url, secret_file, events}");
  v1::WebhookSpec w;
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    if (key == "url") {
      w.set_url(kv.second.as<std::string>());
    } else if (key == "secret_file") {
      w.set_secret_file(kv.second.as<std::string>());
    } else if (key == "events") {
      if (!kv.second.IsSequence()) return absl::InvalidArgumentError("events: expected a list of event words");
      for (const auto& e : kv.second) {
        v1::Notification::Event event;
        if (!v1::Notification::Event_Parse(e.as<std::string>(), &event) ||
            event == v1::Notification::event_unspecified) {
          return absl::InvalidArgumentError(absl::StrCat("events: '", e.as<std::string>(),
                                                         "' is not one of job_succeeded, job_failed, job_cancelled, "
                                                         "job_paused, job_preempted, checkpoint_saved, "
                                                         "evaluation_finished"));
        }
        w.add_events(event);
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(key, ": unknown key (url, secret_file, events)"));
    }
  }
  if (!absl::StartsWith(w.url(), "http://") && !absl::StartsWith(w.url(), "https://")) {
    return absl::InvalidArgumentError("url: an http:// or https:// URL is required");
  }
  if (w.secret_file().empty() || w.secret_file()[0] != '/') {
    return absl::InvalidArgumentError("secret_file: an absolute path is required");
  }
  return w;
}

// A project's outbound: {allow: [...], deny: [...]} (server/notify/destination_policy.h).
absl::StatusOr<DestinationPolicy> ParseOutbound(const YAML::Node& node) {
  if (!node.IsMap()) return absl::InvalidArgumentError("expected a mapping {allow: [...], deny: [...]}");
  std::vector<std::string> lists[2];
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    if (key != "allow" && key != "deny")
      return absl::InvalidArgumentError(absl::StrCat(key, ": unknown key (allow, deny)"));
    if (!kv.second.IsSequence()) {
      return absl::InvalidArgumentError(absl::StrCat(key, ": expected a list of addresses, CIDRs or host names"));
    }
    for (const auto& e : kv.second) lists[key == "deny"].push_back(e.as<std::string>());
  }
  return DestinationPolicy::Parse(lists[0], lists[1], "");
}

// A project's secrets: {name: /absolute/file}, names as resource ids.
absl::StatusOr<std::map<std::string, std::string>> ParseSecrets(const YAML::Node& node) {
  if (!node.IsMap()) return absl::InvalidArgumentError("expected a mapping of names to absolute file paths");
  std::map<std::string, std::string> out;
  for (const auto& kv : node) {
    const std::string name = kv.first.as<std::string>(), path = kv.second.as<std::string>();
    if (!names::ValidId(name)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": a secret's name is [a-z0-9][a-z0-9-]{0,62}"));
    }
    if (path.empty() || path[0] != '/') return absl::InvalidArgumentError(absl::StrCat(name, ": an absolute path"));
    out[name] = path;
  }
  return out;
}

// The keys that bound what a project's tenants reach (issue 78): max_priority,
// preempt_other_projects, outbound, max_concurrent_uploads, secrets. NOT_FOUND when `name` is none of them; YAML's
// conversion errors are thrown, as ParseProjectsFile's other keys' are.
absl::Status SetBoundsKey(const std::string& name, const YAML::Node& value, ProjectSettings* settings) {
  if (name == "max_priority") {
    settings->max_priority = value.as<int64_t>();
    if (*settings->max_priority < -1000000 || *settings->max_priority > 1000000) {
      return absl::InvalidArgumentError("must be -1000000 to 1000000 (resources.priority's range)");
    }
  } else if (name == "preempt_other_projects") {
    settings->preempt_other_projects = value.as<bool>();
  } else if (name == "outbound") {
    absl::StatusOr<DestinationPolicy> outbound = ParseOutbound(value);
    if (!outbound.ok()) return absl::InvalidArgumentError(outbound.status().message());
    settings->outbound = *std::move(outbound);
  } else if (name == "max_concurrent_uploads") {
    settings->max_concurrent_uploads = value.as<int64_t>();
    if (settings->max_concurrent_uploads < 0) return absl::InvalidArgumentError("must be >= 0");
  } else if (name == "secrets") {
    absl::StatusOr<std::map<std::string, std::string>> secrets = ParseSecrets(value);
    if (!secrets.ok()) return absl::InvalidArgumentError(secrets.status().message());
    settings->secrets = *std::move(secrets);
  } else {
    return absl::NotFoundError(name);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::map<std::string, ProjectSettings>> ParseProjectsFile(const std::string& text,
                                                                         const std::string& source) {
  std::map<std::string, ProjectSettings> out;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", e.mark.line + 1, ": ", e.msg));
  }
  const auto error = [&](const YAML::Node& at, const std::string& key, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", at.Mark().line + 1, ": ", key, ": ", what));
  };
  if (root.IsNull()) return out;
  if (!root.IsMap()) return error(root, "(document)", "expected a mapping with the key 'projects'");
  for (const auto& top : root) {
    const std::string key = top.first.as<std::string>();
    if (key != "projects") return error(top.first, key, "unknown key (the file holds 'projects')");
    if (top.second.IsNull()) continue;
    if (!top.second.IsMap()) return error(top.second, "projects", "expected a mapping of project ids");
    for (const auto& p : top.second) {
      const std::string id = p.first.as<std::string>();
      const std::string path = "projects." + id;
      if (!names::ValidId(id)) return error(p.first, path, "a project id is [a-z0-9][a-z0-9-]{0,62}");
      ProjectSettings settings;
      if (!p.second.IsNull() && !p.second.IsMap()) return error(p.second, path, "expected a mapping");
      for (const auto& kv : p.second) {
        const std::string name = kv.first.as<std::string>();
        const std::string field = path + "." + name;
        try {
          if (name == "allowed_roots") {
            if (!kv.second.IsSequence()) return error(kv.second, field, "expected a list of absolute directories");
            for (const auto& r : kv.second) {
              const std::string root_dir = r.as<std::string>();
              if (root_dir.empty() || root_dir[0] != '/') return error(r, field, "each must be an absolute path");
              settings.allowed_roots.push_back(root_dir);
            }
          } else if (name == "max_queued_jobs") {
            settings.max_queued_jobs = kv.second.as<int64_t>();
            if (settings.max_queued_jobs < 0) return error(kv.second, field, "must be >= 0");
          } else if (name == "max_running_devices") {
            settings.max_running_devices = kv.second.as<int64_t>();
            if (settings.max_running_devices < 0) return error(kv.second, field, "must be >= 0");
          } else if (name == "max_device_hours_per_day") {
            settings.max_device_hours_per_day = kv.second.as<double>();
            if (!(settings.max_device_hours_per_day >= 0 && settings.max_device_hours_per_day <= 1e9)) {
              return error(kv.second, field, "must be a number of hours, 0 to 1e9");
            }
          } else if (name == "max_storage_bytes") {
            settings.max_storage_bytes = kv.second.as<int64_t>();
            if (settings.max_storage_bytes < 0) return error(kv.second, field, "must be >= 0");
          } else if (name == "webhooks") {
            if (!kv.second.IsSequence())
              return error(kv.second, field, "expected a list of {url, secret_file, events}");
            for (size_t i = 0; i < kv.second.size(); ++i) {
              absl::StatusOr<v1::WebhookSpec> w = ParseWebhook(kv.second[i]);
              if (!w.ok())
                return error(kv.second[i], absl::StrCat(field, "[", i, "]"), std::string(w.status().message()));
              settings.webhooks.push_back(*std::move(w));
            }
          } else if (absl::Status s = SetBoundsKey(name, kv.second, &settings); !absl::IsNotFound(s)) {
            if (!s.ok()) return error(kv.second, field, std::string(s.message()));
          } else {
            return error(kv.first, field,
                         "unknown key (allowed_roots, max_queued_jobs, max_running_devices, "
                         "max_device_hours_per_day, max_storage_bytes, webhooks, outbound, max_priority, "
                         "preempt_other_projects, max_concurrent_uploads, secrets)");
          }
        } catch (const YAML::Exception& e) {
          return error(kv.second, field, e.msg);
        }
      }
      out[id] = std::move(settings);
    }
  }
  return out;
}

absl::StatusOr<std::shared_ptr<const ProjectRegistry>> ProjectRegistry::Create(const std::string& path) {
  std::shared_ptr<ProjectRegistry> r(new ProjectRegistry(path));
  if (!path.empty()) {
    absl::MutexLock lock(&r->mu_);
    OOMB_RETURN_IF_ERROR(Annotate(r->ReloadLocked(), "tenancy.projects_file"));
  }
  return std::shared_ptr<const ProjectRegistry>(std::move(r));
}

absl::Status ProjectRegistry::ReloadLocked() const {
  OOMB_ASSIGN_OR_RETURN(const std::optional<std::string> text, file_.ReadIfChanged());
  if (!text.has_value()) return absl::OkStatus();
  OOMB_ASSIGN_OR_RETURN(projects_, ParseProjectsFile(*text, file_.path()));
  return absl::OkStatus();
}

void ProjectRegistry::RefreshLocked() const {
  if (file_.path().empty()) return;
  if (absl::Status s = ReloadLocked(); !s.ok()) {
    spdlog::warn("tenancy.projects_file: keeping the settings read before: {}", std::string(s.message()));
  }
}

ProjectSettings ProjectRegistry::Get(const std::string& project) const {
  absl::MutexLock lock(&mu_);
  RefreshLocked();
  const auto it = projects_.find(project);
  return it == projects_.end() ? ProjectSettings() : it->second;
}

std::map<std::string, ProjectSettings> ProjectRegistry::All() const {
  absl::MutexLock lock(&mu_);
  RefreshLocked();
  return projects_;
}

}  // namespace oomb::server
