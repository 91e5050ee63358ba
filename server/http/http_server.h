// The HTTP/1.1 transport under the gateway (server/http/gateway.h): libmicrohttpd's event loop,
// so that no thread is ever held by a client. A connection waiting for its client's bytes (a
// slow or idle client), for the service's answer (a call in flight) or for the next event of a
// stream (SSE, a download) is suspended in the event loop, not parked on a thread; the handler's
// work runs on threads of its own (gRPC's, a stream's reader) and wakes the connection when it
// has something to send.
//
// What one client can hold (HttpServerOptions, from the daemon's http.* settings):
//   - connections: at most max_connections_per_client from one IP address and max_connections
//     in all; one more is closed as it is accepted;
//   - time: a request's headers (the TLS handshake included, and the wait for the next request
//     on a kept-alive connection) within header_timeout; a buffered body (JSON, up to
//     max_buffered_body bytes, 413 beyond) within body_timeout; a streamed body (uploads) and
//     any answer while the client is slow to read: idle_timeout without a byte moving. Past a
//     deadline the connection is closed.
// Bodies sent without Content-Length or chunked framing are empty (the request is served at
// once).
//
// TLS (cert_file, key_file): GnuTLS through libmicrohttpd; with client_ca_file, a request
// without a client certificate that CA signed is answered 401 before its handler runs, and the
// verified certificate's subject (RFC 4514, as RFC 2253 prints it) and CN are in HttpRequest.
//
// Thread-safety: HttpCall's Respond*, Wake and SetPoll may be called from any thread; handlers
// run on the event loop's threads and must not block.
#ifndef OOMB_SERVER_HTTP_HTTP_SERVER_H_
#define OOMB_SERVER_HTTP_HTTP_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct MHD_Connection;
struct MHD_Daemon;

namespace oomb::server {

struct HttpServerOptions {
  std::string listen;                               // host:port; port 0 picks one
  std::string cert_file, key_file, client_ca_file;  // all empty: plain HTTP
  int threads = 2;                                  // event-loop threads
  int max_connections = 1024;
  int max_connections_per_client = 64;
  std::chrono::seconds header_timeout{10}, body_timeout{30}, idle_timeout{60};
  size_t max_buffered_body = size_t{4} << 20;
};

struct HttpRequest {
  std::string method, path;                       // path without the query, %-decoded
  std::multimap<std::string, std::string> query;  // decoded
  std::map<std::string, std::string> headers;     // names lower-cased
  std::string peer;                               // "ipv4:1.2.3.4" or "ipv6:[::1]"
  std::string cert_subject, cert_cn;              // a verified client certificate's, or empty
  std::string body;                               // a buffered body
  bool body_too_large = false;                    // over max_buffered_body: `body` is empty
  bool certificate_missing = false;               // client_ca_file set and no certificate it verifies

  // The header's value, or "" when absent.
  std::string Header(const std::string& lower_name) const;
  bool HasHeader(const std::string& lower_name) const { return headers.count(lower_name) > 0; }
};

// Wakes a suspended connection from another thread; shared by a call and whatever works for it
// (a stream's reader, an upload's writer), so that none of them has to keep the call alive.
class HttpWaker {
 public:
  // Any thread: the connection runs its call again (now, or when it next suspends).
  void Wake();
  // Wakes the call at `when` too (the server's sweeper), e.g. to send a keep-alive.
  void WakeAt(std::chrono::steady_clock::time_point when);

 private:
  friend class HttpServer;
  friend class HttpCall;
  friend struct HttpServerCallbacks;
  // The event loop's thread: suspends the connection unless a Wake came since the last run;
  // false when it did not suspend (run again).
  bool SuspendUnlessWoken();
  void Detach();  // the connection is gone: wakes are no-ops from now on

  std::mutex mu_;
  MHD_Connection* conn_ = nullptr;
  bool suspended_ = false, woken_ = false, stopping_ = false;
  std::optional<std::chrono::steady_clock::time_point> wake_at_;
};

// What a streamed answer's producer returns: bytes written into the buffer, or one of these.
inline constexpr ssize_t kStreamWait = 0;    // nothing yet: the call sleeps until woken
inline constexpr ssize_t kStreamEnd = -1;    // the answer is complete
inline constexpr ssize_t kStreamAbort = -2;  // cut short: the connection is closed

// One request and its answer.
class HttpCall : public std::enable_shared_from_this<HttpCall> {
 public:
  explicit HttpCall(HttpRequest request);
  ~HttpCall();
  const HttpRequest& request() const { return request_; }
  std::shared_ptr<HttpWaker> waker() const { return waker_; }

  // The answer (once; later calls are ignored). Headers exclude Content-Type and -Length.
  void Respond(int status, std::string content_type, std::string body,
               std::vector<std::pair<std::string, std::string>> headers = {});
  // A streamed answer of `length` bytes (-1: unknown, sent chunked); the producer runs on the
  // event loop's thread when the client can take more, and must not block.
  using Producer = std::function<ssize_t(char* buffer, size_t max)>;
  void RespondStream(int status, std::string content_type, int64_t length, Producer producer,
                     std::vector<std::pair<std::string, std::string>> headers = {});
  // Runs on the event loop's thread whenever the call is woken before it has an answer (it may
  // answer then). Replaces the previous one.
  void SetPoll(std::function<void()> poll);
  // For a streamed body (HttpHandler::StreamsBody): `write` takes what it can of a piece and
  // returns how much (0: full; Wake when there is room); `end` is told the body is complete.
  void SetBodySink(std::function<size_t(absl::string_view)> write, std::function<void()> end);
  // Called once when the connection is gone (answered or not), on the event loop's thread.
  void OnClose(std::function<void()> closed);

 private:
  friend class HttpServer;
  friend struct HttpServerCallbacks;
  struct Answer;
  void SetAnswer(std::unique_ptr<Answer> answer);  // the first one only; wakes the call
  bool answered() {
    std::lock_guard<std::mutex> lock(mu_);
    return answer_ != nullptr || queued_;
  }
  const HttpRequest request_;
  const std::shared_ptr<HttpWaker> waker_ = std::make_shared<HttpWaker>();
  std::mutex mu_;
  std::unique_ptr<Answer> answer_;  // set once
  bool queued_ = false;             // handed to the connection
  std::function<void()> poll_, closed_;
  std::function<size_t(absl::string_view)> body_write_;
  std::function<void()> body_end_;
};

class HttpHandler {
 public:
  virtual ~HttpHandler() = default;
  // Once the headers are in: whether the body is streamed to the call's sink (Serve then runs
  // at once and sets it) instead of buffered into HttpRequest::body.
  virtual bool StreamsBody(const HttpRequest& request) = 0;
  // The request is in (or, for a streamed body, its headers): answer now or later.
  virtual void Serve(const std::shared_ptr<HttpCall>& call) = 0;
};

class HttpServer {
 public:
  // Binds and serves; UNAVAILABLE naming `listen` when it cannot be bound, INVALID_ARGUMENT when
  // the TLS files do not load.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options, HttpHandler* handler);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  // Wakes every suspended call (their answers end), closes every connection, joins the threads.
  void Stop();
  bool stopping() const { return stopping_; }

 private:
  friend struct HttpServerCallbacks;
  struct Connection;
  struct Request;
  HttpServer(HttpServerOptions options, HttpHandler* handler);
  absl::Status Listen();
  absl::Status StartDaemon();
  int Access(MHD_Connection* conn, const char* url, const char* method, const char* upload_data, size_t* upload_size,
             void** request_context);
  int Begin(MHD_Connection* conn, const char* url, const char* method, void** request_context);
  int Continue(MHD_Connection* conn, Request& r);
  void Connected(MHD_Connection* conn, void** socket_context, bool started);
  void Completed(void** request_context);
  void Sweep();

  const HttpServerOptions options_;
  HttpHandler* const handler_;
  std::string cert_, key_, ca_;  // PEM text, alive while the daemon is
  int listen_fd_ = -1, port_ = 0;
  MHD_Daemon* daemon_ = nullptr;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;                                 // the two registries
  std::map<Connection*, int> connections_;        // socket, for the deadlines
  std::vector<std::weak_ptr<HttpWaker>> wakers_;  // every call's, for the sweeper and Stop
  std::thread sweeper_;
  std::mutex sweep_mu_;
  std::condition_variable sweep_cv_;
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_HTTP_HTTP_SERVER_H_
