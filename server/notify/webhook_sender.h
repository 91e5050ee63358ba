// Delivers the webhook outbox (JobStore::ClaimWebhooks; what goes in it: webhooks.h).
//
// Each message is POSTed with libcurl: Content-Type application/json and the Standard Webhooks
// headers webhook-id, webhook-timestamp (the attempt's time, seconds) and webhook-signature
// (signed with the endpoint's secret, read from its file at each attempt). A 2xx answer removes
// the message. Anything else (an error status, no connection, a timeout, an unreadable secret)
// is retried after retry_initial, doubling up to retry_max, until give_up_after has passed
// since the event, when the message is dropped and an error logged. Redirects are not followed;
// only http and https; TLS is verified against the system's CAs or `ca_file`. A job's own
// endpoint is reached only where its project's destination policy allows
// (server/notify/destination_policy.h), checked at each connection; a refused one is dropped at
// once, with a WARNING event on its job. The projects' endpoints (tenancy.projects_file) are the
// operator's: unchecked.
//
// Endpoints are isolated (issue 78: one hanging receiver held every other's deliveries): an
// endpoint is a URL's scheme, host and port. A dispatcher thread claims the due messages every
// `poll` into one FIFO lane per endpoint; `max_concurrent` worker threads attempt them, at most
// `per_endpoint` at once to one endpoint, so a receiver that hangs holds at most `per_endpoint`
// workers for attempt_timeout each and delays no other endpoint. An endpoint whose attempt
// failed backs off on its own (retry_initial, doubling per consecutive failure, up to
// retry_max): the messages claimed for it meanwhile go back to the store unattempted
// (JobStore::ReleaseWebhook), as do those beyond a lane's room (2 x per_endpoint).
//
// At least once: a message is claimed (held in the store for 2 x attempt_timeout + 5 s, longer
// than it waits in a lane and its attempt take together: a lane starts one within
// attempt_timeout or gives it back) and removed only once delivered or given up; a daemon that
// dies holding messages leaves them due again when their hold passes. In a fleet each message
// goes to one daemon at a time.
//
// Thread-safety: Start and Stop from one thread; SendDue from one thread at a time, and not
// while started.
#ifndef OOMB_SERVER_NOTIFY_WEBHOOK_SENDER_H_
#define OOMB_SERVER_NOTIFY_WEBHOOK_SENDER_H_

#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/job_files.h"
#include "server/notify/destination_policy.h"
#include "server/store/job_store.h"

namespace oomb::server {

struct WebhookSenderOptions {
  absl::Duration retry_initial = absl::Seconds(5);     // notifications.retry_initial_seconds
  absl::Duration retry_max = absl::Hours(1);           // notifications.retry_max_seconds
  absl::Duration give_up_after = absl::Hours(72);      // notifications.give_up_hours
  absl::Duration poll = absl::Milliseconds(250);       // how often the dispatcher claims
  absl::Duration attempt_timeout = absl::Seconds(10);  // one POST, connection included
  std::string ca_file = {};                            // notifications.ca_file; empty: the system's
  std::string user_agent = "oombd";
  // Told each attempt's result: "delivered", "failed" (retried later) or "given_up" (the
  // exporter's oomb_webhook_attempts_total); may be unset.
  std::function<void(const std::string& result)> on_attempt = {};
  // Where a job's own endpoints may be, per project; null: public addresses only.
  DestinationPolicyOf destinations = {};
  int max_concurrent = 16;  // notifications.max_concurrent_deliveries: attempts at once, in all
  int per_endpoint = 2;     // notifications.max_concurrent_per_endpoint: attempts at once to one
};

class WebhookSender {
 public:
  // `files` opens a job's secret files beneath its project's roots; both outlive the sender.
  WebhookSender(JobStore* store, const JobFiles* files, WebhookSenderOptions options);
  ~WebhookSender();  // Stop()

  // Starts the dispatcher and the workers.
  void Start();
  // Returns after the attempts in flight (each at most attempt_timeout); the messages waiting
  // in lanes go back to the store, due at once.
  void Stop();

  // One pass without the threads (tests, tools): claims the messages due now into the lanes and
  // attempts them on this thread, each endpoint's in order; returns how many it attempted.
  int SendDue();

  // When message `m`, which has failed `m.attempts` times before this failure, is next due;
  // nullopt: given up (give_up_after since m.created has passed).
  std::optional<absl::Duration> RetryIn(const OutboxMessage& m, absl::Time now) const;

 private:
  // What an attempt came to; an endpoint's failure backs its lane off, a message's does not.
  enum class Outcome { kDelivered, kEndpointFailed, kMessageFailed, kRefused };
  struct Queued {
    OutboxMessage message;
    absl::Time held_until;  // the claim's hold: started only while an attempt still fits in it
  };
  struct Lane {
    std::deque<Queued> queue;  // claimed, not started
    int in_flight = 0;
    int failures = 0;  // consecutive
    absl::Time backoff_until = absl::InfinitePast();
  };

  // Claims what is due (as much as the lanes have room for) into the lanes; returns how many.
  int Dispatch();
  // The next message a worker may start, with its endpoint (its lane's in_flight counted), or
  // nullopt.
  std::optional<std::pair<std::string, Queued>> TakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool HasWorkOrStop(WebhookSender* sender) ABSL_EXCLUSIVE_LOCKS_REQUIRED(sender->mu_);
  // Attempts what TakeLocked gave, or gives it back when its hold would not cover the attempt;
  // true when attempted.
  bool Run(const std::string& endpoint, const Queued& q);
  // Attempts `m` and records the outcome in the store and in its lane.
  void Deliver(const std::string& endpoint, const OutboxMessage& m);
  // Gives `m` back to the store, due after `due_in` (dropped when it is past give_up_after).
  void Release(const OutboxMessage& m, absl::Duration due_in);
  Outcome Attempt(const OutboxMessage& m, std::string* error);
  absl::StatusOr<std::string> SecretOf(const OutboxMessage& m) const;
  void WarnJob(const OutboxMessage& m, const std::string& message);
  void DispatchLoop();
  void WorkLoop();

  JobStore* const store_;
  const JobFiles* const files_;
  const WebhookSenderOptions options_;
  const absl::Duration hold_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, Lane> lanes_ ABSL_GUARDED_BY(mu_);  // by endpoint
  std::set<int64_t> in_hand_ ABSL_GUARDED_BY(mu_);          // ids queued or in flight
  std::string last_lane_ ABSL_GUARDED_BY(mu_);              // round robin among lanes
  std::thread dispatcher_;
  std::vector<std::thread> workers_;
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_NOTIFY_WEBHOOK_SENDER_H_
