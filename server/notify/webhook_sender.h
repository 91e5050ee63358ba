// Delivers the webhook outbox (JobStore::ClaimWebhooks; what goes in it: webhooks.h).
//
// One thread: every `poll` it claims the messages due, one at a time (in a fleet, each message
// goes to one daemon at a time; one whose daemon died while sending it is due again after
// attempt_timeout and 5 s),
// and POSTs each with libcurl: Content-Type application/json and the Standard Webhooks headers
// webhook-id, webhook-timestamp (the attempt's time, seconds) and webhook-signature (signed
// with the endpoint's secret, read from its file at each attempt). A 2xx answer removes the
// message. Anything else (an error status, no connection, a timeout, an unreadable secret) is
// retried after retry_initial, doubling up to retry_max, until give_up_after has passed since
// the event, when the message is dropped and an error logged. Redirects are not followed;
// only http and https; TLS is verified against the system's CAs or `ca_file`.
//
// Thread-safety: Start and Stop from one thread; SendDue from one thread at a time.
#ifndef OOMB_SERVER_NOTIFY_WEBHOOK_SENDER_H_
#define OOMB_SERVER_NOTIFY_WEBHOOK_SENDER_H_

#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/job_files.h"
#include "server/store/job_store.h"

namespace oomb::server {

struct WebhookSenderOptions {
  absl::Duration retry_initial = absl::Seconds(5);  // notifications.retry_initial_seconds
  absl::Duration retry_max = absl::Hours(1);        // notifications.retry_max_seconds
  absl::Duration give_up_after = absl::Hours(72);   // notifications.give_up_hours
  absl::Duration poll = absl::Milliseconds(500);
  absl::Duration attempt_timeout = absl::Seconds(10);  // one POST, connection included
  std::string ca_file = {};                            // notifications.ca_file; empty: the system's
  std::string user_agent = "oombd";
  // Told each attempt's result: "delivered", "failed" (retried later) or "given_up" (the
  // exporter's oomb_webhook_attempts_total); may be unset.
  std::function<void(const std::string& result)> on_attempt = {};
};

class WebhookSender {
 public:
  // `files` opens a job's secret files beneath its project's roots; both outlive the sender.
  WebhookSender(JobStore* store, const JobFiles* files, WebhookSenderOptions options);
  ~WebhookSender();  // Stop()

  void Start();
  // Returns after the attempt in flight, if any (at most attempt_timeout).
  void Stop();

  // Claims the messages due now (at most 32) and attempts each once; returns how many it
  // attempted.
  int SendDue();

  // When message `m`, which has failed `m.attempts` times before this failure, is next due;
  // nullopt: given up (give_up_after since m.created has passed).
  std::optional<absl::Duration> RetryIn(const OutboxMessage& m, absl::Time now) const;

 private:
  // The error of a failed attempt; empty when delivered.
  std::string Attempt(const OutboxMessage& m);
  absl::StatusOr<std::string> SecretOf(const OutboxMessage& m) const;
  void Loop();

  JobStore* const store_;
  const JobFiles* const files_;
  const WebhookSenderOptions options_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_NOTIFY_WEBHOOK_SENDER_H_
