#include "server/http/http_server.h"

#include <arpa/inet.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/http/http_rules.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kSweepEvery = std::chrono::milliseconds(200);
constexpr size_t kStreamBlock = size_t{64} << 10;

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* field) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  if (in) text << in.rdbuf();
  if (!in || text.str().empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": cannot read ", path));
  return text.str();
}

// "ipv4:1.2.3.4", "ipv6:[::1]": the peer as gRPC names one (without its port); an IPv4 address
// mapped into IPv6 as IPv4.
std::string PeerName(const sockaddr* a) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (a == nullptr) return "";
  if (a->sa_family == AF_INET6) {
    const auto* six = reinterpret_cast<const sockaddr_in6*>(a);
    if (IN6_IS_ADDR_V4MAPPED(&six->sin6_addr)) {
      inet_ntop(AF_INET, &six->sin6_addr.s6_addr[12], text, sizeof text);
      return absl::StrCat("ipv4:", text);
    }
    inet_ntop(AF_INET6, &six->sin6_addr, text, sizeof text);
    return absl::StrCat("ipv6:[", text, "]");
  }
  inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a)->sin_addr, text, sizeof text);
  return absl::StrCat("ipv4:", text);
}

// The verified client certificate's subject and CN into `r`; nothing when there is none or it
// does not verify against the trusted CA.
void ReadClientCertificate(MHD_Connection* conn, HttpRequest* r) {
  const MHD_ConnectionInfo* info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
  if (info == nullptr || info->tls_session == nullptr) return;
  auto session = static_cast<gnutls_session_t>(info->tls_session);
  unsigned status = 0, n = 0;
  if (gnutls_certificate_verify_peers2(session, &status) != GNUTLS_E_SUCCESS || status != 0) return;
  const gnutls_datum_t* certs = gnutls_certificate_get_peers(session, &n);
  gnutls_x509_crt_t crt = nullptr;
  if (certs == nullptr || n == 0 || gnutls_x509_crt_init(&crt) != GNUTLS_E_SUCCESS) return;
  if (gnutls_x509_crt_import(crt, &certs[0], GNUTLS_X509_FMT_DER) == GNUTLS_E_SUCCESS) {
    gnutls_datum_t dn{};
    if (gnutls_x509_crt_get_dn3(crt, &dn, 0) == GNUTLS_E_SUCCESS) {
      r->cert_subject.assign(reinterpret_cast<const char*>(dn.data), dn.size);
      gnutls_free(dn.data);
    }
    char cn[256] = {0};
    size_t size = sizeof cn;
    if (gnutls_x509_crt_get_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, 0, cn, &size) == GNUTLS_E_SUCCESS) {
      r->cert_cn.assign(cn, strnlen(cn, sizeof cn));
    }
  }
  gnutls_x509_crt_deinit(crt);
}

MHD_Result AddHeader(void* cls, MHD_ValueKind, const char* key, const char* value) {
  static_cast<std::map<std::string, std::string>*>(cls)->emplace(absl::AsciiStrToLower(key), value ? value : "");
  return MHD_YES;
}

MHD_Result AddQuery(void* cls, MHD_ValueKind, const char* key, const char* value) {
  static_cast<std::multimap<std::string, std::string>*>(cls)->emplace(key, value ? value : "");
  return MHD_YES;
}

}  // namespace

// The answer a call holds until its connection takes it.
struct HttpCall::Answer {
  int status = 200;
  std::string content_type, body;
  std::vector<std::pair<std::string, std::string>> headers;
  bool streamed = false;
  int64_t length = -1;
  Producer producer;
};

// Per connection (libmicrohttpd's socket context): where its current request stands, for the
// header and body deadlines. Guarded by HttpServer::mu_.
struct HttpServer::Connection {
  enum Phase { kHead, kBody, kOpen, kClosing } phase = kHead;
  Clock::time_point since = Clock::now();
};

// Per request (libmicrohttpd's request context).
struct HttpServer::Request {
  Connection* connection = nullptr;
  HttpRequest pending;  // until the call is made
  std::shared_ptr<HttpCall> call;
  bool streamed = false, served = false;
};

// The C callbacks, forwarding to the server.
struct HttpServerCallbacks {
  static MHD_Result Access(void* cls, MHD_Connection* conn, const char* url, const char* method, const char*,
                           const char* upload_data, size_t* upload_size, void** request_context) {
    return static_cast<HttpServer*>(cls)->Access(conn, url, method, upload_data, upload_size, request_context) != 0
               ? MHD_YES
               : MHD_NO;
  }
  static void Completed(void* cls, MHD_Connection*, void** request_context, MHD_RequestTerminationCode) {
    static_cast<HttpServer*>(cls)->Completed(request_context);
  }
  // The path and each query name and value, decoded in place by the transcoder's own decoder
  // (server/http/http_rules.h), which never lengthens them.
  static size_t Unescape(void*, MHD_Connection*, char* s) {
    const std::string decoded = PercentDecode(s);
    std::memcpy(s, decoded.data(), decoded.size());
    s[decoded.size()] = '\0';
    return decoded.size();
  }
  static void Connected(void* cls, MHD_Connection* conn, void** socket_context, MHD_ConnectionNotificationCode code) {
    static_cast<HttpServer*>(cls)->Connected(conn, socket_context, code == MHD_CONNECTION_NOTIFY_STARTED);
  }
  static void Log(void*, const char* format, va_list args) {
    char text[512];
    vsnprintf(text, sizeof text, format, args);
    spdlog::debug("http: {}", std::string(absl::StripTrailingAsciiWhitespace(text)));
  }
  // A streamed answer's state (the response's reader context).
  struct Stream {
    HttpServer* server;
    std::shared_ptr<HttpCall> call;
    HttpCall::Producer producer;
  };
  static ssize_t Read(void* cls, uint64_t, char* buffer, size_t max) {
    auto* s = static_cast<Stream*>(cls);
    for (;;) {
      if (s->server->stopping()) return MHD_CONTENT_READER_END_WITH_ERROR;
      const ssize_t n = s->producer(buffer, max);
      if (n > 0) return n;
      if (n == kStreamEnd) return MHD_CONTENT_READER_END_OF_STREAM;
      if (n == kStreamAbort) return MHD_CONTENT_READER_END_WITH_ERROR;
      if (s->call->waker()->SuspendUnlessWoken()) return 0;
    }
  }
  static void FreeStream(void* cls) { delete static_cast<Stream*>(cls); }
  // The call's answer, handed to the connection; false while it has none.
  static bool Queue(HttpServer* server, MHD_Connection* conn, const std::shared_ptr<HttpCall>& call) {
    std::unique_ptr<HttpCall::Answer> a;
    {
      std::lock_guard<std::mutex> lock(call->mu_);
      if (call->queued_) return true;
      if (call->answer_ == nullptr) return false;
      a = std::move(call->answer_);
      call->queued_ = true;
    }
    MHD_Response* response;
    if (a->streamed) {
      auto* s = new Stream{server, call, std::move(a->producer)};
      response = MHD_create_response_from_callback(a->length < 0 ? MHD_SIZE_UNKNOWN : static_cast<uint64_t>(a->length),
                                                   kStreamBlock, &Read, s, &FreeStream);
    } else {
      response = MHD_create_response_from_buffer(a->body.size(), a->body.data(), MHD_RESPMEM_MUST_COPY);
    }
    if (!a->content_type.empty()) MHD_add_response_header(response, "Content-Type", a->content_type.c_str());
    for (const auto& [name, value] : a->headers) MHD_add_response_header(response, name.c_str(), value.c_str());
    MHD_queue_response(conn, static_cast<unsigned>(a->status), response);
    MHD_destroy_response(response);
    return true;
  }
};

std::string HttpRequest::Header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? "" : it->second;
}

void HttpWaker::Wake() {
  std::lock_guard<std::mutex> lock(mu_);
  wake_at_.reset();
  if (suspended_ && conn_ != nullptr) {
    suspended_ = false;
    MHD_resume_connection(conn_);
  } else {
    woken_ = true;
  }
}

void HttpWaker::WakeAt(std::chrono::steady_clock::time_point when) {
  std::lock_guard<std::mutex> lock(mu_);
  wake_at_ = when;
}

bool HttpWaker::SuspendUnlessWoken() {
  std::lock_guard<std::mutex> lock(mu_);
  if (woken_ || stopping_ || conn_ == nullptr) {
    woken_ = false;
    return false;
  }
  suspended_ = true;
  MHD_suspend_connection(conn_);
  return true;
}

void HttpWaker::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  conn_ = nullptr;
  suspended_ = false;
}

HttpCall::HttpCall(HttpRequest request) : request_(std::move(request)) {}
HttpCall::~HttpCall() = default;

void HttpCall::SetAnswer(std::unique_ptr<Answer> answer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (answer_ != nullptr || queued_) return;
    answer_ = std::move(answer);
  }
  waker_->Wake();
}

void HttpCall::Respond(int status, std::string content_type, std::string body,
                       std::vector<std::pair<std::string, std::string>> headers) {
  auto a = std::make_unique<Answer>();
  a->status = status;
  a->content_type = std::move(content_type);
  a->body = std::move(body);
  a->headers = std::move(headers);
  SetAnswer(std::move(a));
}

void HttpCall::RespondStream(int status, std::string content_type, int64_t length, Producer producer,
                             std::vector<std::pair<std::string, std::string>> headers) {
  auto a = std::make_unique<Answer>();
  a->status = status;
  a->content_type = std::move(content_type);
  a->headers = std::move(headers);
  a->streamed = true;
  a->length = length;
  a->producer = std::move(producer);
  SetAnswer(std::move(a));
}

void HttpCall::SetPoll(std::function<void()> poll) {
  std::lock_guard<std::mutex> lock(mu_);
  poll_ = std::move(poll);
}

void HttpCall::SetBodySink(std::function<size_t(absl::string_view)> write, std::function<void()> end) {
  std::lock_guard<std::mutex> lock(mu_);
  body_write_ = std::move(write);
  body_end_ = std::move(end);
}

void HttpCall::OnClose(std::function<void()> closed) {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = std::move(closed);
}

HttpServer::HttpServer(HttpServerOptions options, HttpHandler* handler)
    : options_(std::move(options)), handler_(handler) {}

HttpServer::~HttpServer() { Stop(); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options, HttpHandler* handler) {
  std::unique_ptr<HttpServer> s(new HttpServer(std::move(options), handler));
  const HttpServerOptions& o = s->options_;
  if (!o.cert_file.empty()) {
    OOMB_ASSIGN_OR_RETURN(s->cert_, ReadPem(o.cert_file, "tls.cert_file"));
    OOMB_ASSIGN_OR_RETURN(s->key_, ReadPem(o.key_file, "tls.key_file"));
    if (!o.client_ca_file.empty()) {
      OOMB_ASSIGN_OR_RETURN(s->ca_, ReadPem(o.client_ca_file, "tls.client_ca_file"));
    }
  }
  OOMB_RETURN_IF_ERROR(s->Listen());
  OOMB_RETURN_IF_ERROR(s->StartDaemon());
  s->sweeper_ = std::thread([p = s.get()] { p->Sweep(); });
  return s;
}

absl::Status HttpServer::Listen() {
  const std::string& listen = options_.listen;
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("http.listen: expected host:port, got '", listen, "'"));
  }
  std::string host = listen.substr(0, colon);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found) != 0 || found == nullptr) {
    return absl::UnavailableError(absl::StrCat("http.listen: cannot resolve ", listen));
  }
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      listen_fd_ = fd;
    } else {
      close(fd);
    }
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) return absl::UnavailableError(absl::StrCat("http.listen: cannot listen on ", listen));
  sockaddr_storage bound{};
  socklen_t size = sizeof bound;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &size);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return absl::OkStatus();
}

absl::Status HttpServer::StartDaemon() {
  const HttpServerOptions& o = options_;
  unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
  if (!cert_.empty()) flags |= MHD_USE_TLS;
  std::vector<MHD_OptionItem> opts = {
      {MHD_OPTION_LISTEN_SOCKET, listen_fd_, nullptr},
      {MHD_OPTION_THREAD_POOL_SIZE, std::max(1, o.threads), nullptr},
      {MHD_OPTION_CONNECTION_LIMIT, std::max(1, o.max_connections), nullptr},
      {MHD_OPTION_PER_IP_CONNECTION_LIMIT, std::max(1, o.max_connections_per_client), nullptr},
      {MHD_OPTION_CONNECTION_TIMEOUT, static_cast<intptr_t>(o.idle_timeout.count()), nullptr},
      {MHD_OPTION_NOTIFY_COMPLETED, reinterpret_cast<intptr_t>(&HttpServerCallbacks::Completed), this},
      {MHD_OPTION_NOTIFY_CONNECTION, reinterpret_cast<intptr_t>(&HttpServerCallbacks::Connected), this},
      {MHD_OPTION_EXTERNAL_LOGGER, reinterpret_cast<intptr_t>(&HttpServerCallbacks::Log), nullptr},
      {MHD_OPTION_UNESCAPE_CALLBACK, reinterpret_cast<intptr_t>(&HttpServerCallbacks::Unescape), nullptr},
  };
  if (!cert_.empty()) {
    opts.push_back({MHD_OPTION_HTTPS_MEM_KEY, 0, key_.data()});
    opts.push_back({MHD_OPTION_HTTPS_MEM_CERT, 0, cert_.data()});
    if (!ca_.empty()) opts.push_back({MHD_OPTION_HTTPS_MEM_TRUST, 0, ca_.data()});
  }
  opts.push_back({MHD_OPTION_END, 0, nullptr});
  daemon_ = MHD_start_daemon(flags, 0, nullptr, nullptr, &HttpServerCallbacks::Access, this, MHD_OPTION_ARRAY,
                             opts.data(), MHD_OPTION_END);
  if (daemon_ != nullptr) return absl::OkStatus();
  close(listen_fd_);
  listen_fd_ = -1;
  if (!cert_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("http.listen: cannot load tls.cert_file/tls.key_file", ca_.empty() ? "" : "/tls.client_ca_file"));
  }
  return absl::UnavailableError(absl::StrCat("http.listen: cannot serve on ", options_.listen));
}

void HttpServer::Stop() {
  if (stopping_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(sweep_mu_);
    sweep_cv_.notify_all();
  }
  if (sweeper_.joinable()) sweeper_.join();
  std::vector<std::shared_ptr<HttpWaker>> wakers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& w : wakers_) {
      if (auto p = w.lock()) wakers.push_back(std::move(p));
    }
  }
  for (const auto& w : wakers) {
    std::lock_guard<std::mutex> lock(w->mu_);
    w->stopping_ = true;
    if (w->suspended_ && w->conn_ != nullptr) {
      w->suspended_ = false;
      MHD_resume_connection(w->conn_);
    }
  }
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
  daemon_ = nullptr;
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
}

int HttpServer::Access(MHD_Connection* conn, const char* url, const char* method, const char* upload_data,
                       size_t* upload_size, void** request_context) {
  if (*request_context == nullptr) return Begin(conn, url, method, request_context);
  Request& r = *static_cast<Request*>(*request_context);
  if (*upload_size == 0) return Continue(conn, r);
  const absl::string_view piece(upload_data, *upload_size);
  if (!r.streamed) {
    HttpRequest& q = r.pending;
    if (q.body.size() + piece.size() > options_.max_buffered_body) q.body_too_large = true;
    if (!q.body_too_large) q.body.append(piece.data(), piece.size());
    *upload_size = 0;  // past the limit, read and dropped: the answer comes once it is all in
    return MHD_YES;
  }
  if (r.call->body_write_ == nullptr || r.call->answered()) {
    *upload_size = 0;  // refused already: the rest is read and dropped
    return MHD_YES;
  }
  const size_t taken = r.call->body_write_(piece);
  *upload_size -= taken;
  if (taken == 0) r.call->waker()->SuspendUnlessWoken();
  return MHD_YES;
}

int HttpServer::Begin(MHD_Connection* conn, const char* url, const char* method, void** request_context) {
  auto r = std::make_unique<Request>();
  HttpRequest& q = r->pending;
  q.method = method;
  q.path = url;
  MHD_get_connection_values(conn, MHD_HEADER_KIND, &AddHeader, &q.headers);
  MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, &AddQuery, &q.query);
  const MHD_ConnectionInfo* info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  q.peer = PeerName(info != nullptr ? info->client_addr : nullptr);
  if (!cert_.empty()) ReadClientCertificate(conn, &q);
  q.certificate_missing = !ca_.empty() && q.cert_cn.empty() && q.cert_subject.empty();
  const MHD_ConnectionInfo* socket = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  r->connection = socket != nullptr ? static_cast<Connection*>(socket->socket_context) : nullptr;
  int64_t declared = 0;
  const bool sized = absl::SimpleAtoi(q.Header("content-length"), &declared);
  r->streamed = !q.certificate_missing && handler_->StreamsBody(q);
  q.body_too_large = !r->streamed && sized && declared > static_cast<int64_t>(options_.max_buffered_body);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (r->connection != nullptr) {
      r->connection->phase = r->streamed ? Connection::kOpen : Connection::kBody;
      r->connection->since = Clock::now();
    }
  }
  Request& ref = *r;
  *request_context = r.release();
  // Answered at once (the rest of the body is then dropped and the connection closed): a
  // missing certificate or a body declared too large; a streamed body's call starts now.
  if (q.certificate_missing || q.body_too_large || ref.streamed) return Continue(conn, ref);
  return MHD_YES;
}

int HttpServer::Continue(MHD_Connection* conn, Request& r) {
  if (r.call == nullptr) {
    r.call = std::make_shared<HttpCall>(std::move(r.pending));
    {
      std::lock_guard<std::mutex> lock(r.call->waker_->mu_);
      r.call->waker_->conn_ = conn;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      wakers_.push_back(r.call->waker_);
      if (r.connection != nullptr) r.connection->phase = Connection::kOpen;
    }
    handler_->Serve(r.call);
    if (r.streamed && !r.served) return MHD_YES;  // the body comes first
  }
  if (r.streamed && !r.served) {  // the streamed body is complete
    r.served = true;
    std::function<void()> end;
    {
      std::lock_guard<std::mutex> lock(r.call->mu_);
      end = r.call->body_end_;
    }
    if (end) end();
  }
  r.served = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (r.connection != nullptr) r.connection->phase = Connection::kOpen;
  }
  for (;;) {
    if (HttpServerCallbacks::Queue(this, conn, r.call)) return MHD_YES;
    if (stopping_) {
      r.call->Respond(503, "application/json",
                      "{\"error\":{\"code\":503,\"status\":\"UNAVAILABLE\",\"message\":"
                      "\"the daemon is stopping\"}}");
      continue;
    }
    std::function<void()> poll;
    {
      std::lock_guard<std::mutex> lock(r.call->mu_);
      poll = r.call->poll_;
    }
    if (poll) poll();
    if (HttpServerCallbacks::Queue(this, conn, r.call)) return MHD_YES;
    if (r.call->waker_->SuspendUnlessWoken()) return MHD_YES;
  }
}

void HttpServer::Connected(MHD_Connection* conn, void** socket_context, bool started) {
  std::lock_guard<std::mutex> lock(mu_);
  if (started) {
    const MHD_ConnectionInfo* info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    auto* c = new Connection();
    connections_[c] = info != nullptr ? info->connect_fd : -1;
    *socket_context = c;
    return;
  }
  auto* c = static_cast<Connection*>(*socket_context);
  if (c == nullptr) return;
  connections_.erase(c);  // before libmicrohttpd closes the socket: the sweeper never shuts another
  delete c;
  *socket_context = nullptr;
}

void HttpServer::Completed(void** request_context) {
  auto* r = static_cast<Request*>(*request_context);
  if (r == nullptr) return;
  *request_context = nullptr;
  std::function<void()> closed;
  if (r->call != nullptr) {
    r->call->waker_->Detach();
    std::lock_guard<std::mutex> lock(r->call->mu_);
    closed = std::move(r->call->closed_);
    r->call->poll_ = nullptr;
    r->call->body_write_ = nullptr;
    r->call->body_end_ = nullptr;
  }
  if (closed) closed();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (r->connection != nullptr && connections_.count(r->connection) > 0) {
      r->connection->phase = Connection::kHead;  // kept alive: the next request's headers
      r->connection->since = Clock::now();
    }
  }
  delete r;
}

void HttpServer::Sweep() {
  std::unique_lock<std::mutex> sweep(sweep_mu_);
  while (!stopping_) {
    sweep_cv_.wait_for(sweep, kSweepEvery);
    const Clock::time_point now = Clock::now();
    std::vector<std::shared_ptr<HttpWaker>> due;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [c, fd] : connections_) {
        const bool late = (c->phase == Connection::kHead && now - c->since > options_.header_timeout) ||
                          (c->phase == Connection::kBody && now - c->since > options_.body_timeout);
        if (!late || fd < 0) continue;
        shutdown(fd, SHUT_RDWR);  // the event loop sees the end and closes the connection
        c->phase = Connection::kClosing;
      }
      std::vector<std::weak_ptr<HttpWaker>> alive;
      for (auto& w : wakers_) {
        std::shared_ptr<HttpWaker> p = w.lock();
        if (p == nullptr) continue;
        alive.push_back(w);
        std::lock_guard<std::mutex> wl(p->mu_);
        if (p->wake_at_.has_value() && *p->wake_at_ <= now) due.push_back(p);
      }
      wakers_.swap(alive);
    }
    for (const auto& w : due) w->Wake();
  }
}

}  // namespace oomb::server
