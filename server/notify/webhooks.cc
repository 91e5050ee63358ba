#include "server/notify/webhooks.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <random>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/time_util.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

constexpr char kSecretPrefix[] = "whsec_";
constexpr size_t kMinKeyBytes = 16;

// A message in the proto3 JSON mapping, as a JSON value.
nlohmann::json ToJson(const google::protobuf::Message& m) {
  std::string text;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(m, &text, o).ok()) return nlohmann::json::object();
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

std::string RandomWebhookId() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::random_device rd;
  std::string id = "msg_";
  for (int i = 0; i < 32; ++i) id += kHex[rd() % 16];
  return id;
}

std::string Payload(const v1::Job& job, const v1::JobEvent& event, const std::string& type) {
  const JobRef ref = ParseStoredName(job.name());
  nlohmann::json data = {
      {"job", job.name()},
      {"project", ref.project},
      {"display_name", job.spec().display_name()},
      {"labels", nlohmann::json::object()},
      {"state", v1::Job::State_Name(job.state())},
      {"reason", event.message()},
      {"sequence", event.sequence()},
      {"progress", ToJson(job.progress())},
      {"checkpoint_dir", job.checkpoint_dir()},
  };
  for (const auto& [k, v] : job.labels()) data["labels"][k] = v;
  if (job.has_error()) data["error"] = ToJson(job.error());
  if (event.has_checkpoint()) data["checkpoint"] = ToJson(event.checkpoint());
  if (event.progress().has_evaluation()) data["evaluation"] = ToJson(event.progress().evaluation());
  const nlohmann::json body = {
      {"type", type},
      {"timestamp", google::protobuf::util::TimeUtil::ToString(event.time())},
      {"data", std::move(data)},
  };
  return body.dump();
}

bool Hears(const v1::WebhookSpec& webhook, const std::string& type) {
  if (webhook.events().empty()) return true;
  return std::any_of(webhook.events().begin(), webhook.events().end(),
                     [&](int e) { return WebhookEventType(static_cast<v1::Notification::Event>(e)) == type; });
}

}  // namespace

std::string WebhookEventType(v1::Notification::Event event) {
  std::string word = v1::Notification::Event_Name(event);
  const size_t underscore = word.find('_');
  if (underscore != std::string::npos) word[underscore] = '.';
  return word;
}

std::string WebhookEventType(const v1::Job& job, const v1::JobEvent& event) {
  switch (event.type()) {
    case v1::JobEvent::STATE_CHANGED:
      switch (event.state()) {
        case v1::Job::SUCCEEDED:
          return WebhookEventType(v1::Notification::job_succeeded);
        case v1::Job::FAILED:
          return WebhookEventType(v1::Notification::job_failed);
        case v1::Job::CANCELLED:
          return WebhookEventType(v1::Notification::job_cancelled);
        case v1::Job::PAUSED:
          return WebhookEventType(v1::Notification::job_paused);
        case v1::Job::QUEUED:  // back in the queue: preempted, or any other return to it
          return job.preempted_by().empty() ? "" : WebhookEventType(v1::Notification::job_preempted);
        default:
          return "";
      }
    case v1::JobEvent::CHECKPOINT_SAVED:
      return WebhookEventType(v1::Notification::checkpoint_saved);
    case v1::JobEvent::STEP:
      return event.progress().has_evaluation() ? WebhookEventType(v1::Notification::evaluation_finished) : "";
    default:
      return "";
  }
}

std::vector<OutboxMessage> WebhookMessages(const v1::Job& job, const v1::JobEvent& event,
                                           const std::vector<v1::WebhookSpec>& project_webhooks) {
  std::vector<OutboxMessage> out;
  const std::string type = WebhookEventType(job, event);
  if (type.empty()) return out;
  const JobRef ref = ParseStoredName(job.name());
  std::string payload;
  auto add = [&](const v1::WebhookSpec& w, const std::string& secret_project) {
    if (!Hears(w, type)) return;
    if (payload.empty()) payload = Payload(job, event, type);
    OutboxMessage m;
    m.webhook_id = RandomWebhookId();
    m.job_id = ref.id;
    m.url = w.url();
    m.secret_file = w.secret_file();
    m.secret_project = secret_project;
    m.type = type;
    m.payload = payload;
    out.push_back(std::move(m));
  };
  for (const v1::WebhookSpec& w : job.spec().notifications().webhooks()) add(w, ref.project);
  for (const v1::WebhookSpec& w : project_webhooks) add(w, "");
  return out;
}

OutboxPolicy WebhookOutboxPolicy(std::shared_ptr<const ProjectRegistry> projects, bool job_webhooks) {
  return [projects = std::move(projects), job_webhooks](const v1::Job& job, const v1::JobEvent& event) {
    if (WebhookEventType(job, event).empty()) return std::vector<OutboxMessage>();  // steps: nothing to read
    std::vector<v1::WebhookSpec> project_webhooks;
    if (projects != nullptr) project_webhooks = projects->Get(ParseStoredName(job.name()).project).webhooks;
    if (job_webhooks) return WebhookMessages(job, event, project_webhooks);
    v1::Job without = job;
    without.mutable_spec()->clear_notifications();
    return WebhookMessages(without, event, project_webhooks);
  };
}

absl::StatusOr<std::string> ParseWebhookSecret(const std::string& text, const std::string& source) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  if (!absl::ConsumePrefix(&s, kSecretPrefix)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a webhook secret (expected \"", kSecretPrefix, "\" and a base64 key)"));
  }
  std::string key;
  if (!absl::Base64Unescape(s, &key) || key.size() < kMinKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": the secret after \"", kSecretPrefix,
                                                   "\" must be base64 of at least ", kMinKeyBytes, " bytes"));
  }
  return key;
}

std::string SignWebhook(const std::string& key, const std::string& webhook_id, int64_t timestamp,
                        const std::string& body) {
  const std::string content = absl::StrCat(webhook_id, ".", timestamp, ".", body);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(content.data()),
       content.size(), mac, &mac_len);
  return absl::StrCat("v1,", absl::Base64Escape(absl::string_view(reinterpret_cast<const char*>(mac), mac_len)));
}

absl::Status CheckJobWebhooks(const v1::JobSpec& spec, const FileAccess& inputs, bool job_webhooks) {
  const auto& webhooks = spec.notifications().webhooks();
  if (!webhooks.empty() && !job_webhooks) {
    return absl::FailedPreconditionError(
        "notifications.webhooks: this daemon takes no job's own webhooks (notifications.job_webhooks is false); "
        "its projects' endpoints are set in tenancy.projects_file");
  }
  for (int i = 0; i < webhooks.size(); ++i) {
    const std::string field = absl::StrCat("notifications.webhooks[", i, "].secret_file");
    OOMB_RETURN_IF_ERROR(Annotate(inputs.CheckPath(webhooks[i].secret_file()), field));
    absl::StatusOr<std::string> text = inputs.ReadFile(webhooks[i].secret_file(), 4096);
    if (!text.ok()) {
      return absl::IsNotFound(text.status())
                 ? absl::InvalidArgumentError(absl::StrCat(field, ": ", text.status().message()))
                 : Annotate(text.status(), field);
    }
    OOMB_RETURN_IF_ERROR(ParseWebhookSecret(*text, absl::StrCat(field, ": ", webhooks[i].secret_file())).status());
  }
  return absl::OkStatus();
}

}  // namespace oomb::server
