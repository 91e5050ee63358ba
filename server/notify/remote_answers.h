// What the daemon reads from servers that jobs name (an MLflow tracking server, a webhook
// receiver): untrusted bytes. Every function here is total: any body, any status, gives a value
// or an error status; nothing throws, asserts or aborts (issue 78: one job's tracking server
// answering `ok`, `{}`, `[]`, a number, a string, null or a run id of the wrong type took the
// daemon down). Fuzzed by tests/fuzz/fuzz_mlflow_answer.cc and tests/fuzz/fuzz_webhook_answer.cc.
//
// Thread-safety: pure functions.
#ifndef OOMB_SERVER_NOTIFY_REMOTE_ANSWERS_H_
#define OOMB_SERVER_NOTIFY_REMOTE_ANSWERS_H_

#include <initializer_list>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace oomb::server {

// An MLflow REST answer to `path` ("runs/create"). HTTP 200: the body's JSON value, whatever its
// shape (an empty object when the body is not JSON: MLflow answers calls that return nothing
// with {}, and a proxy may answer them with anything); the caller reads it with MlflowStringAt.
// Any other status: NOT_FOUND when MLflow says RESOURCE_DOES_NOT_EXIST, UNAVAILABLE for 5xx,
// FAILED_PRECONDITION otherwise, the message naming `path`, the status, MLflow's error_code and
// message when they are strings, else an excerpt of the body.
absl::StatusOr<nlohmann::json> ParseMlflowAnswer(const std::string& path, long status,  // NOLINT(runtime/int)
                                                 const std::string& body);

// The id at `keys` of an MLflow answer (e.g. {"run", "info", "run_id"}): a string of 1 to 256
// characters of [A-Za-z0-9._-] (what goes back into URLs and the job's MLflow link). DATA_LOSS
// naming `path` and the keys when the answer has no such string (a missing key, a value of
// another type, an object that is not one, an id of other characters).
absl::StatusOr<std::string> MlflowIdAt(const nlohmann::json& answer, std::initializer_list<const char*> keys,
                                       const std::string& path);

// The error of a webhook receiver's answer: empty for 2xx; else "HTTP <status>" and, when the
// body is not empty, ": " and a printable excerpt of at most 200 bytes of it (what is logged and
// stored as the message's last error).
std::string WebhookAnswerError(long status, const std::string& body);  // NOLINT(runtime/int)

}  // namespace oomb::server

#endif  // OOMB_SERVER_NOTIFY_REMOTE_ANSWERS_H_
