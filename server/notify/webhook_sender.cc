#include "server/notify/webhook_sender.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "server/notify/http_client.h"
#include "server/notify/remote_answers.h"
#include "server/notify/webhooks.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

constexpr int kMaxClaim = 64;            // messages one claim takes at most
constexpr size_t kErrorBodyBytes = 200;  // of a refusing endpoint's answer, kept as the error

// The endpoint a URL names: its scheme, host and port (a receiver that hangs hangs on every path).
std::string EndpointOf(const std::string& url) {
  absl::StatusOr<HttpUrl> u = ParseHttpUrl(url);
  return u.ok() ? absl::StrCat(u->scheme, "://", u->host, ":", u->port) : url;
}

}  // namespace

WebhookSender::WebhookSender(JobStore* store, const JobFiles* files, WebhookSenderOptions options)
    : store_(store),
      files_(files),
      options_(std::move(options)),
      hold_(2 * options_.attempt_timeout + absl::Seconds(5)) {}

WebhookSender::~WebhookSender() { Stop(); }

void WebhookSender::Start() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = false;
  }
  dispatcher_ = std::thread([this] { DispatchLoop(); });
  for (int i = 0; i < std::max(1, options_.max_concurrent); ++i) workers_.emplace_back([this] { WorkLoop(); });
}

void WebhookSender::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (dispatcher_.joinable()) dispatcher_.join();
  for (std::thread& w : workers_) w.join();
  workers_.clear();
  std::vector<OutboxMessage> waiting;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [endpoint, lane] : lanes_) {
      for (Queued& q : lane.queue) waiting.push_back(std::move(q.message));
    }
    lanes_.clear();
    in_hand_.clear();
  }
  for (const OutboxMessage& m : waiting) {  // a restarted daemon sends them at once
    if (absl::Status s = store_->ReleaseWebhook(m.id, absl::ZeroDuration()); !s.ok())
      spdlog::warn("webhooks: {}", s.ToString());
  }
}

void WebhookSender::DispatchLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    mu_.Unlock();
    const int claimed = Dispatch();
    mu_.Lock();
    if (claimed < kMaxClaim) mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.poll);
  }
}

std::optional<absl::Duration> WebhookSender::RetryIn(const OutboxMessage& m, absl::Time now) const {
  if (now - m.created >= options_.give_up_after) return std::nullopt;
  absl::Duration wait = options_.retry_initial;
  for (int i = 0; i < m.attempts && wait < options_.retry_max; ++i) wait *= 2;
  return std::min(wait, options_.retry_max);
}

int WebhookSender::Dispatch() {
  const int per_lane = 2 * std::max(1, options_.per_endpoint);  // in flight and waiting
  int room = 0;
  {
    absl::MutexLock lock(&mu_);
    room = 2 * std::max(1, options_.max_concurrent) - static_cast<int>(in_hand_.size());
    for (auto it = lanes_.begin(); it != lanes_.end();) {  // forget idle endpoints that are well
      const Lane& l = it->second;
      const bool idle = l.queue.empty() && l.in_flight == 0 && l.failures == 0;
      it = idle ? lanes_.erase(it) : std::next(it);
    }
  }
  if (room <= 0) return 0;
  const absl::Time held_until = absl::Now() + hold_;  // the claim's own hold ends after this
  absl::StatusOr<std::vector<OutboxMessage>> due = store_->ClaimWebhooks(std::min(room, kMaxClaim), hold_);
  if (!due.ok()) {
    spdlog::warn("webhooks: {}", due.status().ToString());
    return 0;
  }
  std::vector<std::pair<OutboxMessage, absl::Duration>> back;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (OutboxMessage& m : *due) {
      if (in_hand_.count(m.id) > 0) continue;  // its hold passed while it waited here: renewed
      Lane& lane = lanes_[EndpointOf(m.url)];
      if (lane.backoff_until > now) {
        back.emplace_back(std::move(m), lane.backoff_until - now);
      } else if (static_cast<int>(lane.queue.size()) + lane.in_flight >= per_lane) {
        back.emplace_back(std::move(m), options_.poll);
      } else {
        in_hand_.insert(m.id);
        lane.queue.push_back({std::move(m), held_until});
      }
    }
  }
  for (const auto& [m, due_in] : back) Release(m, due_in);
  return static_cast<int>(due->size());
}

std::optional<std::pair<std::string, WebhookSender::Queued>> WebhookSender::TakeLocked() {
  if (lanes_.empty()) return std::nullopt;
  const absl::Time now = absl::Now();
  auto it = lanes_.upper_bound(last_lane_);
  for (size_t i = 0; i < lanes_.size(); ++i, ++it) {
    if (it == lanes_.end()) it = lanes_.begin();
    Lane& lane = it->second;
    if (lane.queue.empty() || lane.in_flight >= std::max(1, options_.per_endpoint) || lane.backoff_until > now) {
      continue;
    }
    Queued q = std::move(lane.queue.front());
    lane.queue.pop_front();
    ++lane.in_flight;
    last_lane_ = it->first;
    return std::make_pair(it->first, std::move(q));
  }
  return std::nullopt;
}

bool WebhookSender::HasWorkOrStop(WebhookSender* sender) {
  if (sender->stop_) return true;
  const absl::Time now = absl::Now();
  for (const auto& [endpoint, lane] : sender->lanes_) {
    if (!lane.queue.empty() && lane.in_flight < std::max(1, sender->options_.per_endpoint) &&
        lane.backoff_until <= now) {
      return true;
    }
  }
  return false;
}

void WebhookSender::WorkLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    std::optional<std::pair<std::string, Queued>> next = TakeLocked();
    if (!next.has_value()) {
      mu_.AwaitWithTimeout(absl::Condition(&HasWorkOrStop, this), options_.poll);
      continue;
    }
    mu_.Unlock();
    Run(next->first, next->second);
    mu_.Lock();
  }
}

int WebhookSender::SendDue() {
  Dispatch();
  int attempted = 0;
  for (;;) {
    std::optional<std::pair<std::string, Queued>> next;
    {
      absl::MutexLock lock(&mu_);
      next = TakeLocked();
    }
    if (!next.has_value()) break;
    attempted += Run(next->first, next->second) ? 1 : 0;
  }
  return attempted;
}

bool WebhookSender::Run(const std::string& endpoint, const Queued& q) {
  // An attempt that could outlast the claim's hold would race another claim of the message
  // (another daemon's): it goes back, due at once, and is claimed afresh.
  if (absl::Now() + options_.attempt_timeout >= q.held_until) {
    Release(q.message, absl::ZeroDuration());
    absl::MutexLock lock(&mu_);
    --lanes_[endpoint].in_flight;
    in_hand_.erase(q.message.id);
    return false;
  }
  Deliver(endpoint, q.message);
  return true;
}

void WebhookSender::Deliver(const std::string& endpoint, const OutboxMessage& m) {
  std::string error;
  const Outcome outcome = Attempt(m, &error);
  std::optional<absl::Duration> retry_in;
  if (outcome == Outcome::kDelivered) {
    if (m.attempts > 0) {
      spdlog::info("webhooks: {} {} to {} delivered after {} failed attempts", m.type, m.webhook_id, m.url, m.attempts);
    }
  } else if (outcome == Outcome::kRefused) {
    spdlog::error("webhooks: {} {} to {} dropped: {}", m.type, m.webhook_id, m.url, error);
    WarnJob(m, absl::StrCat("webhook ", m.type, " to ", m.url, " not sent: ", error));
  } else {
    retry_in = RetryIn(m, absl::Now());
    if (!retry_in.has_value()) {
      spdlog::error("webhooks: {} {} to {} given up after {} attempts: {}", m.type, m.webhook_id, m.url, m.attempts + 1,
                    error);
    } else if (m.attempts == 0) {
      spdlog::warn("webhooks: {} {} to {} failed ({}); retrying with backoff", m.type, m.webhook_id, m.url, error);
    }
  }
  if (absl::Status s = store_->FinishWebhook(m.id, retry_in, error); !s.ok())
    spdlog::warn("webhooks: {}", s.ToString());
  if (options_.on_attempt) {
    options_.on_attempt(outcome == Outcome::kDelivered ? "delivered" : retry_in ? "failed" : "given_up");
  }
  // The lane: a failing endpoint backs off, and what waits for it goes back to the store.
  std::vector<OutboxMessage> waiting;
  absl::Duration backoff;
  {
    absl::MutexLock lock(&mu_);
    Lane& lane = lanes_[endpoint];
    --lane.in_flight;
    in_hand_.erase(m.id);
    if (outcome == Outcome::kDelivered) {
      lane.failures = 0;
      lane.backoff_until = absl::InfinitePast();
    } else if (outcome == Outcome::kEndpointFailed) {
      ++lane.failures;
      backoff = options_.retry_initial;
      for (int i = 1; i < lane.failures && backoff < options_.retry_max; ++i) backoff *= 2;
      backoff = std::min(backoff, options_.retry_max);
      lane.backoff_until = std::max(lane.backoff_until, absl::Now() + backoff);
      for (Queued& q : lane.queue) {
        in_hand_.erase(q.message.id);
        waiting.push_back(std::move(q.message));
      }
      lane.queue.clear();
    }
  }
  for (const OutboxMessage& w : waiting) Release(w, backoff);
}

void WebhookSender::Release(const OutboxMessage& m, absl::Duration due_in) {
  if (absl::Now() - m.created >= options_.give_up_after) {
    spdlog::error("webhooks: {} {} to {} given up after {} attempts: its endpoint is still failing ({})", m.type,
                  m.webhook_id, m.url, m.attempts, m.last_error);
    if (absl::Status s = store_->FinishWebhook(m.id, std::nullopt, m.last_error); !s.ok())
      spdlog::warn("webhooks: {}", s.ToString());
    if (options_.on_attempt) options_.on_attempt("given_up");
    return;
  }
  if (absl::Status s = store_->ReleaseWebhook(m.id, due_in); !s.ok()) spdlog::warn("webhooks: {}", s.ToString());
}

absl::StatusOr<std::string> WebhookSender::SecretOf(const OutboxMessage& m) const {
  std::shared_ptr<const FileAccess> access = FileAccess::Unconfined();
  if (!m.secret_project.empty()) {
    OOMB_ASSIGN_OR_RETURN(access, files_->Inputs(m.secret_project));
  }
  OOMB_ASSIGN_OR_RETURN(const std::string text, access->ReadFile(m.secret_file, 4096));
  return ParseWebhookSecret(text, m.secret_file);
}

void WebhookSender::WarnJob(const OutboxMessage& m, const std::string& message) {
  absl::StatusOr<UpdateResult> r = store_->Update(m.job_id, [&](v1::Job*, std::vector<v1::JobEvent>* events) {
    v1::JobEvent e;
    e.set_type(v1::JobEvent::WARNING);
    e.set_message(BoundedText(message));
    events->push_back(std::move(e));
    return absl::OkStatus();
  });
  if (!r.ok()) spdlog::warn("webhooks: {}: recording a warning: {}", m.job_id, r.status().ToString());
}

WebhookSender::Outcome WebhookSender::Attempt(const OutboxMessage& m, std::string* error) {
  absl::StatusOr<std::string> key = SecretOf(m);
  if (!key.ok()) {
    *error = absl::StrCat("the secret: ", key.status().message());
    return Outcome::kMessageFailed;
  }
  // A job's own endpoint (its secret read beneath its project's roots) goes through its
  // project's destination policy; a project's endpoint is the operator's.
  DestinationPolicy destinations = DestinationPolicy::Unrestricted();
  if (!m.secret_project.empty()) {
    destinations = options_.destinations ? options_.destinations(m.secret_project) : DestinationPolicy();
  }
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
      .destinations = std::move(destinations),
  };
  absl::StatusOr<HttpResponse> answer = SendHttp(request);
  if (!answer.ok()) {
    *error = std::string(answer.status().message());
    if (absl::IsPermissionDenied(answer.status())) return Outcome::kRefused;
    return absl::IsInvalidArgument(answer.status()) ? Outcome::kMessageFailed : Outcome::kEndpointFailed;
  }
  *error = WebhookAnswerError(answer->status, answer->body);
  return error->empty() ? Outcome::kDelivered : Outcome::kEndpointFailed;
}

}  // namespace oomb::server
