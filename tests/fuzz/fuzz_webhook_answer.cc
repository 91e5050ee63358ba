// libFuzzer target: the webhook sender's reading of a receiver's answer
// (server/notify/remote_answers.h: WebhookAnswerError), on arbitrary bytes and statuses, as a
// tenant's own endpoint may send them (issue 78). Contract: no crash, leak, UB or hang; a 2xx is
// no error; any other status is an error of at most a bounded size, printable (no control
// characters reach the log or the outbox's last_error).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/notify/remote_answers.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const long status = size < 2 ? 200 : (data[0] << 8 | data[1]) % 1000;  // NOLINT(runtime/int)
  const std::string body = size < 2 ? "" : std::string(reinterpret_cast<const char*>(data) + 2, size - 2);
  const std::string error = oomb::server::WebhookAnswerError(status, body);
  if ((status >= 200 && status < 300) != error.empty()) std::abort();
  if (error.size() > 300) std::abort();
  for (char c : error) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) std::abort();
  }
  return 0;
}
