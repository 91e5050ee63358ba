// libFuzzer target: the MLflow client's reading of a tracking server's answers
// (server/notify/remote_answers.h), on arbitrary bytes and statuses, as a tenant's own tracking
// server may send them (issue 78). Contract: no crash, leak, UB or hang; every refusal says
// why; an id read is 1 to 256 characters of [A-Za-z0-9._-].
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/notify/remote_answers.h"

namespace {

void CheckId(const absl::StatusOr<std::string>& id) {
  if (!id.ok()) {
    if (id.status().message().empty()) std::abort();
    return;
  }
  if (id->empty() || id->size() > 256) std::abort();
  for (char c : *id) {
    const bool fits =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!fits) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first byte picks the HTTP status; the rest is the body.
  static constexpr long kStatuses[] = {200, 200, 200, 200, 400, 401, 404, 500, 502, 302, 0, 999};       // NOLINT
  const long status = size == 0 ? 200 : kStatuses[data[0] % (sizeof kStatuses / sizeof kStatuses[0])];  // NOLINT
  const std::string body = size == 0 ? "" : std::string(reinterpret_cast<const char*>(data) + 1, size - 1);
  for (const char* path : {"experiments/get-by-name", "experiments/create", "runs/create", "runs/log-batch"}) {
    const absl::StatusOr<nlohmann::json> answer = oomb::server::ParseMlflowAnswer(path, status, body);
    if (!answer.ok()) {
      if (answer.status().message().empty()) std::abort();
      continue;
    }
    CheckId(oomb::server::MlflowIdAt(*answer, {"experiment", "experiment_id"}, path));
    CheckId(oomb::server::MlflowIdAt(*answer, {"experiment_id"}, path));
    CheckId(oomb::server::MlflowIdAt(*answer, {"run", "info", "run_id"}, path));
  }
  return 0;
}
