// Webhooks: what a job's events tell HTTP endpoints, as the Standard Webhooks specification
// (standardwebhooks.com) says, and the outbox messages that carry it (docs/API.md, "Being told").
//
// Endpoints come from two places: a job's spec (notifications.webhooks, its secret file read
// beneath the project's allowed roots) and its project's settings in tenancy.projects_file
// (server/projects.h; the daemon's files, read as they are). Each endpoint hears the events it
// lists, all of them when it lists none:
//
//   job.succeeded, job.failed, job.cancelled, job.paused   the job entered that state
//   job.preempted      stopped for a job of higher priority, queued to resume
//   checkpoint.saved   a checkpoint was written (the final one too)
//   evaluation.finished  the evaluation section's suites ran
//
// A message's body, built when the event is stored (so a retry sends the same bytes):
//
//   {"type": "job.succeeded", "timestamp": "2026-11-29T14:00:00Z",  // the event's time
//    "data": {"job": "projects/p/jobs/x", "project": "p", "display_name": "...", "labels": {},
//             "state": "SUCCEEDED", "reason": "<the event's message>", "sequence": 12,
//             "progress": {...}, "checkpoint_dir": "...",             // the result so far
//             "error": {...},        // job.failed
//             "checkpoint": {...},   // checkpoint.saved
//             "evaluation": {...}}}  // evaluation.finished
//
// (progress, error, checkpoint and evaluation in the proto3 JSON mapping of jobs.proto). The
// webhook-id is "msg_" and 32 random hex digits, the same on every attempt: receivers drop
// repeats by it (delivery is at least once).
#ifndef OOMB_SERVER_NOTIFY_WEBHOOKS_H_
#define OOMB_SERVER_NOTIFY_WEBHOOKS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "oomb/v1/job_spec.pb.h"
#include "oomb/v1/jobs.pb.h"
#include "server/projects.h"
#include "server/store/job_store.h"
#include "worker/common/file_access.h"

namespace oomb::server {

// The payload type of `event` of `job` ("job.succeeded"), or "" when no webhook is told of it.
std::string WebhookEventType(const v1::Job& job, const v1::JobEvent& event);

// The payload type of a spec's event word (job_succeeded: "job.succeeded").
std::string WebhookEventType(v1::Notification::Event event);

// The outbox messages for `event` of `job`: one per endpoint of the job's spec and of its
// project's settings that hears this event type.
std::vector<OutboxMessage> WebhookMessages(const v1::Job& job, const v1::JobEvent& event,
                                           const std::vector<v1::WebhookSpec>& project_webhooks);

// What JobStore::SetOutboxPolicy takes: WebhookMessages with the project's endpoints from
// `projects` (null: none). With `job_webhooks` false, the spec's endpoints are not used
// (notifications.job_webhooks).
OutboxPolicy WebhookOutboxPolicy(std::shared_ptr<const ProjectRegistry> projects, bool job_webhooks);

// The key of a Standard Webhooks secret: "whsec_" then base64 (whitespace around it ignored).
// INVALID_ARGUMENT naming `source` when it is not one, or its key is shorter than 16 bytes.
absl::StatusOr<std::string> ParseWebhookSecret(const std::string& text, const std::string& source);

// The webhook-signature header's value for a message: "v1," and the base64 HMAC-SHA256 of
// "{webhook_id}.{timestamp}.{body}" under `key`.
std::string SignWebhook(const std::string& key, const std::string& webhook_id, int64_t timestamp,
                        const std::string& body);

// CreateJob's check of notifications.webhooks, each error naming its field
// (notifications.webhooks[1].secret_file): the secret files open through `inputs` and hold
// secrets; FAILED_PRECONDITION when the daemon does not take jobs' own endpoints. (Where the
// URLs may point: CheckJobDestinations, server/notify/destination_policy.h.)
absl::Status CheckJobWebhooks(const v1::JobSpec& spec, const FileAccess& inputs, bool job_webhooks);

}  // namespace oomb::server

#endif  // OOMB_SERVER_NOTIFY_WEBHOOKS_H_
