// One HTTP request with libcurl, as the daemon's outgoing calls make them (webhooks, MLflow):
// only http and https, redirects never followed, no proxy from the environment, TLS verified
// against the system's CAs or `ca_file`, a deadline for the whole request, no signals. Every
// address libcurl is about to open a socket to (after its own DNS resolution) is asked of
// `destinations` first (server/notify/destination_policy.h): a refused one is never connected
// to. The answer's body is kept up to `max_body` bytes.
//
// Thread-safety: any thread (one easy handle per request).
#ifndef OOMB_SERVER_NOTIFY_HTTP_CLIENT_H_
#define OOMB_SERVER_NOTIFY_HTTP_CLIENT_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/notify/destination_policy.h"

namespace oomb::server {

struct HttpRequest {
  std::string method = "POST";  // GET or POST
  std::string url;
  std::vector<std::string> headers = {};  // "Name: value"
  std::string body = {};                  // POST only
  absl::Duration timeout = absl::Seconds(10);
  std::string ca_file = {};  // empty: the system's CAs
  std::string user_agent = "oombd";
  size_t max_body = 1 << 20;
  // Who may be reached: by default public addresses only; the operator's own destinations
  // pass DestinationPolicy::Unrestricted().
  DestinationPolicy destinations = {};
};

struct HttpResponse {
  long status = 0;  // NOLINT(runtime/int): libcurl's type
  std::string body;
};

// PERMISSION_DENIED when `destinations` refused every address the URL's host resolved to (the
// policy's reason); UNAVAILABLE naming the URL when no answer came otherwise (no connection, a
// timeout, TLS refused); any answer, whatever its status, is returned.
absl::StatusOr<HttpResponse> SendHttp(const HttpRequest& request);

// `text` percent-encoded for a URL's query (libcurl's escaping).
std::string UrlEscape(const std::string& text);

}  // namespace oomb::server

#endif  // OOMB_SERVER_NOTIFY_HTTP_CLIENT_H_
