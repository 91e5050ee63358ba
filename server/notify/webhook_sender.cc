#include "server/notify/webhook_sender.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "server/notify/http_client.h"
#include "server/notify/webhooks.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

constexpr int kMaxPerPass = 32;          // attempts before the loop looks at `stop` again
constexpr size_t kErrorBodyBytes = 200;  // of a refusing endpoint's answer, kept as the error

}  // namespace

WebhookSender::WebhookSender(JobStore* store, const JobFiles* files, WebhookSenderOptions options)
    : store_(store), files_(files), options_(std::move(options)) {}

WebhookSender::~WebhookSender() { Stop(); }

void WebhookSender::Start() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] { Loop(); });
}

void WebhookSender::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void WebhookSender::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    mu_.Unlock();
    const int attempted = SendDue();
    mu_.Lock();
    if (attempted == 0) mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.poll);
  }
}

std::optional<absl::Duration> WebhookSender::RetryIn(const OutboxMessage& m, absl::Time now) const {
  if (now - m.created >= options_.give_up_after) return std::nullopt;
  absl::Duration wait = options_.retry_initial;
  for (int i = 0; i < m.attempts && wait < options_.retry_max; ++i) wait *= 2;
  return std::min(wait, options_.retry_max);
}

int WebhookSender::SendDue() {
  // One message at a time, held for one attempt and a margin: a message whose sender died while
  // sending it is due again that soon.
  const absl::Duration hold = options_.attempt_timeout + absl::Seconds(5);
  int attempted = 0;
  for (; attempted < kMaxPerPass; ++attempted) {
    absl::StatusOr<std::vector<OutboxMessage>> due = store_->ClaimWebhooks(1, hold);
    if (!due.ok()) {
      spdlog::warn("webhooks: {}", due.status().ToString());
      break;
    }
    if (due->empty()) break;
    const OutboxMessage& m = due->front();
    const std::string error = Attempt(m);
    std::optional<absl::Duration> retry_in;
    if (error.empty()) {
      if (m.attempts > 0) {
        spdlog::info("webhooks: {} {} to {} delivered after {} failed attempts", m.type, m.webhook_id, m.url,
                     m.attempts);
      }
    } else {
      retry_in = RetryIn(m, absl::Now());
      if (!retry_in.has_value()) {
        spdlog::error("webhooks: {} {} to {} given up after {} attempts: {}", m.type, m.webhook_id, m.url,
                      m.attempts + 1, error);
      } else if (m.attempts == 0) {
        spdlog::warn("webhooks: {} {} to {} failed ({}); retrying with backoff", m.type, m.webhook_id, m.url, error);
      }
    }
    if (absl::Status s = store_->FinishWebhook(m.id, retry_in, error); !s.ok())
      spdlog::warn("webhooks: {}", s.ToString());
    if (options_.on_attempt) options_.on_attempt(error.empty() ? "delivered" : retry_in ? "failed" : "given_up");
  }
  return attempted;
}

absl::StatusOr<std::string> WebhookSender::SecretOf(const OutboxMessage& m) const {
  std::shared_ptr<const FileAccess> access = FileAccess::Unconfined();
  if (!m.secret_project.empty()) {
    OOMB_ASSIGN_OR_RETURN(access, files_->Inputs(m.secret_project));
  }
  OOMB_ASSIGN_OR_RETURN(const std::string text, access->ReadFile(m.secret_file, 4096));
  return ParseWebhookSecret(text, m.secret_file);
}

std::string WebhookSender::Attempt(const OutboxMessage& m) {
  absl::StatusOr<std::string> key = SecretOf(m);
  if (!key.ok()) return absl::StrCat("the secret: ", key.status().message());
  const int64_t timestamp = absl::ToUnixSeconds(absl::Now());
  HttpRequest request{
      .url = m.url,
      .headers = {"Content-Type: application/json", absl::StrCat("webhook-id: ", m.webhook_id),
                  absl::StrCat("webhook-timestamp: ", timestamp),
                  absl::StrCat("webhook-signature: ", SignWebhook(*key, m.webhook_id, timestamp, m.payload))},
      .body = m.payload,
      .timeout = options_.attempt_timeout,
      .ca_file = options_.ca_file,
      .user_agent = options_.user_agent,
      .max_body = kErrorBodyBytes,
  };
  absl::StatusOr<HttpResponse> answer = SendHttp(request);
  if (!answer.ok()) return std::string(answer.status().message());
  if (answer->status >= 200 && answer->status < 300) return "";
  return absl::StrCat("HTTP ", answer->status, answer->body.empty() ? "" : ": ", answer->body);
}

}  // namespace oomb::server
