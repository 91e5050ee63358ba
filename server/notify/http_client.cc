#include "server/notify/http_client.h"

#include <curl/curl.h>
#include <sys/socket.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Sink {
  std::string* body;
  size_t max;
};

size_t Keep(char* data, size_t size, size_t n, void* out) {
  auto* sink = static_cast<Sink*>(out);
  if (sink->body->size() < sink->max) sink->body->append(data, std::min(size * n, sink->max - sink->body->size()));
  return size * n;
}

// The connect-time gate: each address libcurl would connect to, asked of the policy.
struct Gate {
  const DestinationPolicy* policy;
  std::string host;
  absl::Status refused;      // the first refusal
  bool any_allowed = false;  // an address was let through (then a failure is no refusal)
};

curl_socket_t OpenAllowedSocket(void* data, curlsocktype purpose, curl_sockaddr* address) {
  auto* gate = static_cast<Gate*>(data);
  std::optional<IpAddress> a = IpAddress::FromSockaddr(&address->addr);
  absl::Status s = a.has_value() ? gate->policy->Check(gate->host, *a)
                                 : absl::PermissionDeniedError("destination: not an IP address");
  if (purpose != CURLSOCKTYPE_IPCXN && s.ok()) s = absl::PermissionDeniedError("destination: not a TCP connection");
  if (!s.ok()) {
    if (gate->refused.ok()) gate->refused = s;
    return CURL_SOCKET_BAD;
  }
  gate->any_allowed = true;
  return ::socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
}

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

}  // namespace

absl::StatusOr<HttpResponse> SendHttp(const HttpRequest& request) {
  InitCurlOnce();
  std::unique_ptr<CURL, CurlDeleter> curl(curl_easy_init());
  if (curl == nullptr) return absl::InternalError("libcurl: cannot make a handle");
  curl_slist* headers = nullptr;
  for (const std::string& h : request.headers) headers = curl_slist_append(headers, h.c_str());
  std::unique_ptr<curl_slist, CurlDeleter> header_list(headers);
  HttpResponse response;
  Sink sink{&response.body, request.max_body};
  Gate gate{&request.destinations, "", absl::OkStatus(), false};
  if (!request.destinations.unrestricted()) {
    OOMB_ASSIGN_OR_RETURN(const HttpUrl url, ParseHttpUrl(request.url));
    gate.host = url.host;
  }
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_PROXY, "");  // a proxy would be the address checked
  curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, OpenAllowedSocket);
  curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, &gate);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  if (request.method == "POST") {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, request.body.data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  } else {
    curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
  }
  curl_easy_setopt(c, CURLOPT_USERAGENT, request.user_agent.c_str());
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(absl::ToInt64Milliseconds(request.timeout)));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, Keep);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
  if (!request.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, request.ca_file.c_str());
  char error[CURL_ERROR_SIZE] = {};
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  const CURLcode rc = curl_easy_perform(c);
  if (rc != CURLE_OK) {
    if (!gate.refused.ok() && !gate.any_allowed) return gate.refused;
    return absl::UnavailableError(
        absl::StrCat(request.url, ": libcurl: ", error[0] != '\0' ? error : curl_easy_strerror(rc)));
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &response.status);
  return response;
}

std::string UrlEscape(const std::string& text) {
  InitCurlOnce();
  char* escaped = curl_easy_escape(nullptr, text.data(), static_cast<int>(text.size()));
  if (escaped == nullptr) return "";
  std::string out(escaped);
  curl_free(escaped);
  return out;
}

}  // namespace oomb::server
