#include "server/http/gateway.h"

#include <httplib.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include <spdlog/spdlog.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "google/protobuf/util/json_util.h"
#include "google/rpc/status.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "oomb/v1/datasets.grpc.pb.h"
#include "oomb/v1/jobs.grpc.pb.h"
#include "server/auth.h"
#include "server/grpc_status.h"
#include "server/http/openapi.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

using google::protobuf::Message;

constexpr size_t kMaxJsonBody = size_t{4} << 20;
constexpr auto kUnaryDeadline = std::chrono::minutes(5);
constexpr auto kKeepAlive = std::chrono::seconds(15);
constexpr size_t kUploadChunk = size_t{1} << 20;

// AIP-193's HTTP status for a gRPC code.
int HttpStatus(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return 200;
    case grpc::StatusCode::CANCELLED:
      return 499;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE:
      return 400;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return 504;
    case grpc::StatusCode::NOT_FOUND:
      return 404;
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::ABORTED:
      return 409;
    case grpc::StatusCode::PERMISSION_DENIED:
      return 403;
    case grpc::StatusCode::UNAUTHENTICATED:
      return 401;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return 429;
    case grpc::StatusCode::UNIMPLEMENTED:
      return 501;
    case grpc::StatusCode::UNAVAILABLE:
      return 503;
    default:
      return 500;  // UNKNOWN, INTERNAL, DATA_LOSS
  }
}

std::string ToJson(const Message& m) {
  google::protobuf::util::JsonPrintOptions o;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(m, &out, o).ok()) return "{}";
  return out;
}

// {"error": {...}} for `s` (AIP-193), its details included; `http` overrides the HTTP status
// the code maps to (413 for a body too large, 404/405 for routes).
std::string ErrorJson(const grpc::Status& s, int http = 0) {
  google::rpc::Status details;
  if (!s.error_details().empty()) details.ParseFromString(s.error_details());
  details.set_code(http != 0 ? http : HttpStatus(s.error_code()));
  details.set_message(s.error_message());
  std::string json = ToJson(details);  // {"code":..,"message":..,"details":[..]}
  const std::string status = absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code()));
  // "status": the gRPC code's name, beside Status's own fields.
  if (json.size() >= 2 && json.front() == '{') {
    json = absl::StrCat("{\"status\":\"", status, "\"", json.size() > 2 ? "," : "", json.substr(1));
  }
  return absl::StrCat("{\"error\":", json, "}");
}

void SendError(httplib::Response& res, const grpc::Status& s, int http = 0) {
  res.status = http != 0 ? http : HttpStatus(s.error_code());
  res.set_content(ErrorJson(s, http), "application/json");
}

void SendError(httplib::Response& res, const absl::Status& s, int http = 0) { SendError(res, ToGrpcStatus(s), http); }

std::string FromByteBuffer(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!b.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// "ipv4:1.2.3.4", "ipv6:[::1]": the HTTP peer, as gRPC names a peer (without its port).
std::string PeerName(const std::string& addr) {
  return addr.find(':') != std::string::npos ? absl::StrCat("ipv6:[", addr, "]") : absl::StrCat("ipv4:", addr);
}

// What the service learns of the HTTP caller (see the file comment of gateway.h).
void AddCaller(const httplib::Request& req, const std::string& key, grpc::ClientContext* ctx) {
  if (req.has_header("Authorization")) ctx->AddMetadata("authorization", req.get_header_value("Authorization"));
  ctx->AddMetadata(kGatewayKeyMetadata, key);
  ctx->AddMetadata(kGatewayPeerMetadata, PeerName(req.remote_addr));
  if (req.ssl == nullptr) return;
  SSL* ssl = const_cast<SSL*>(req.ssl);  // OpenSSL's getters take a non-const SSL
  if (SSL_get_verify_result(ssl) != X509_V_OK) return;
  X509* cert = SSL_get1_peer_certificate(ssl);
  if (cert == nullptr) return;
  BIO* bio = BIO_new(BIO_s_mem());
  X509_NAME_print_ex(bio, X509_get_subject_name(cert), 0, XN_FLAG_RFC2253);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string subject(data, static_cast<size_t>(n > 0 ? n : 0));
  BIO_free(bio);
  char cn[256] = {0};
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
  X509_free(cert);
  ctx->AddMetadata(kGatewaySubjectMetadata, subject);
  ctx->AddMetadata(kGatewayCommonNameMetadata, cn);
}

// A server stream read on a thread of its own into a queue, so that the HTTP side can wait with
// a timeout (keep-alive comments) and stop it (TryCancel) when its client goes away.
template <typename Response>
class StreamPump {
 public:
  StreamPump(std::unique_ptr<grpc::ClientContext> ctx, std::unique_ptr<grpc::ClientReader<Response>> reader)
      : ctx_(std::move(ctx)), reader_(std::move(reader)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~StreamPump() {
    ctx_->TryCancel();
    thread_.join();
  }
  // The next message: true with `out` set; false at the end (`status` then set); nullopt when
  // `wait` passed first.
  std::optional<bool> Next(Response* out, grpc::Status* status, std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, wait, [&] { return !queue_.empty() || done_; })) return std::nullopt;
    if (!queue_.empty()) {
      *out = std::move(queue_.front());
      queue_.pop_front();
      cv_.notify_all();
      return true;
    }
    *status = status_;
    return false;
  }
  // The first message, read before the answer's headers are sent.
  bool First(Response* out, grpc::Status* status) {
    for (;;) {
      std::optional<bool> r = Next(out, status, std::chrono::hours(1));
      if (r.has_value()) return *r;
    }
  }

 private:
  static constexpr size_t kMaxQueued = 16;  // back-pressure: the reader waits for the HTTP side
  void Run() {
    Response m;
    while (reader_->Read(&m)) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return queue_.size() < kMaxQueued || cancelled_; });
      if (cancelled_) break;
      queue_.push_back(std::move(m));
      cv_.notify_all();
    }
    grpc::Status s = reader_->Finish();
    std::lock_guard<std::mutex> lock(mu_);
    status_ = s;
    done_ = true;
    cv_.notify_all();
  }

  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReader<Response>> reader_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Response> queue_;
  bool done_ = false, cancelled_ = false;
  grpc::Status status_;
};

// "Range: bytes=N-" or "bytes=N-M" (one range); nullopt for none or another form.
std::optional<std::pair<int64_t, int64_t>> ParseRange(const std::string& header) {
  if (!absl::StartsWith(header, "bytes=") || header.find(',') != std::string::npos) return std::nullopt;
  const std::string spec = header.substr(6);
  const size_t dash = spec.find('-');
  if (dash == std::string::npos || dash == 0) return std::nullopt;  // suffix ranges are not served
  int64_t first = 0, last = -1;
  if (!absl::SimpleAtoi(spec.substr(0, dash), &first)) return std::nullopt;
  if (dash + 1 < spec.size() && !absl::SimpleAtoi(spec.substr(dash + 1), &last)) return std::nullopt;
  if (last >= 0 && last < first) return std::nullopt;
  return std::make_pair(first, last);
}

}  // namespace

absl::StatusOr<HttpRoutes> ApiRoutes() {
  return HttpRoutes::FromServices({v1::Job::descriptor()->file()->FindServiceByName("JobService"),
                                   v1::Dataset::descriptor()->file()->FindServiceByName("DatasetService")});
}

HttpGateway::HttpGateway(HttpGatewayOptions options, HttpRoutes routes)
    : options_(std::move(options)), routes_(std::move(routes)) {}

HttpGateway::~HttpGateway() { Stop(); }

void HttpGateway::Stop() {
  stopping_ = true;
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<std::unique_ptr<HttpGateway>> HttpGateway::Start(HttpGatewayOptions options) {
  OOMB_ASSIGN_OR_RETURN(HttpRoutes routes, ApiRoutes());
  std::unique_ptr<HttpGateway> g(new HttpGateway(std::move(options), std::move(routes)));
  const HttpGatewayOptions& o = g->options_;
  if (o.cert_file.empty()) {
    g->server_ = std::make_unique<httplib::Server>();
  } else {
    auto ssl = std::make_unique<httplib::SSLServer>(o.cert_file.c_str(), o.key_file.c_str(),
                                                    o.client_ca_file.empty() ? nullptr : o.client_ca_file.c_str());
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat("http.listen: cannot load tls.cert_file/tls.key_file",
                                                     o.client_ca_file.empty() ? "" : "/tls.client_ca_file"));
    }
    g->server_ = std::move(ssl);
  }
  httplib::Server& s = *g->server_;
  const int threads = o.threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  s.set_read_timeout(60);
  s.set_write_timeout(60);
  HttpGateway* self = g.get();
  s.Get(".*", [self](const httplib::Request& req, httplib::Response& res) { self->Handle(req, res, ""); });
  const auto with_body = [self](const httplib::Request& req, httplib::Response& res,
                                const httplib::ContentReader& reader) {
    std::optional<HttpMatch> match = self->routes_.Find(req.method, req.path);
    if (match && match->route->method->client_streaming()) {
      self->Upload(req, res, *match, reader);
      return;
    }
    std::string body;
    bool too_large = false;
    reader([&](const char* data, size_t n) {
      // Past the limit the rest is read and dropped: left unread, it would be taken for the
      // connection's next request.
      too_large = too_large || body.size() + n > kMaxJsonBody;
      if (!too_large) body.append(data, n);
      return true;
    });
    if (too_large) {
      res.set_header("Connection", "close");
      SendError(res,
                absl::InvalidArgumentError(absl::StrCat("the request body is larger than ", kMaxJsonBody, " bytes")),
                413);
      return;
    }
    self->Handle(req, res, body);
  };
  s.Post(".*", with_body);
  s.Put(".*", with_body);
  s.Patch(".*", with_body);
  s.Delete(".*", with_body);
  const size_t colon = o.listen.rfind(':');
  if (colon == std::string::npos) return absl::InvalidArgumentError("http.listen: expected host:port");
  std::string host = o.listen.substr(0, colon);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) host = host.substr(1, host.size() - 2);
  int port = 0;
  if (!absl::SimpleAtoi(o.listen.substr(colon + 1), &port)) return absl::InvalidArgumentError("http.listen: bad port");
  if (port == 0) {
    g->port_ = s.bind_to_any_port(host);
  } else if (s.bind_to_port(host, port)) {
    g->port_ = port;
  }
  if (g->port_ <= 0) return absl::UnavailableError(absl::StrCat("http.listen: cannot listen on ", o.listen));
  g->thread_ = std::thread([self] { self->server_->listen_after_bind(); });
  return g;
}

void HttpGateway::Handle(const httplib::Request& req, httplib::Response& res, const std::string& body) {
  if (req.method == "GET" && req.path == "/v1/openapi.json") {
    res.set_content(OpenApiDocument(routes_), "application/json");
    return;
  }
  std::optional<HttpMatch> match = routes_.Find(req.method, req.path);
  if (!match) {
    const bool known = routes_.PathKnown(req.path);
    SendError(res,
              grpc::Status(grpc::StatusCode::NOT_FOUND,
                           absl::StrCat(known ? "no method " + req.method + " on " : "no route ", Excerpt(req.path))),
              known ? 405 : 404);
    return;
  }
  const google::protobuf::MethodDescriptor* method = match->route->method;
  std::unique_ptr<Message> request(
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(method->input_type())->New());
  std::multimap<std::string, std::string> query(req.params.begin(), req.params.end());
  if (method->server_streaming() && method->name() == "WatchJob" && req.has_header("Last-Event-ID")) {
    query.erase("after_sequence");
    query.emplace("after_sequence", req.get_header_value("Last-Event-ID"));
  }
  if (absl::Status s = HttpRoutes::FillRequest(*match, query, body, request.get()); !s.ok()) {
    SendError(res, s);
    return;
  }
  if (method->server_streaming()) {
    if (method->name() == "WatchJob") {
      Watch(req, res, static_cast<const v1::WatchJobRequest&>(*request));
    } else {
      Download(req, res, static_cast<const v1::DownloadCheckpointRequest&>(*request));
    }
    return;
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kUnaryDeadline);
  AddCaller(req, options_.gateway_key, &ctx);
  const std::string bytes = request->SerializeAsString();
  grpc::Slice slice(bytes);
  grpc::ByteBuffer in(&slice, 1), out;
  grpc::GenericStub stub(options_.channel);
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, absl::StrCat("/", method->service()->full_name(), "/", method->name()), grpc::StubOptions(), &in,
                 &out, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) {
    SendError(res, status);
    return;
  }
  std::unique_ptr<Message> response(
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(method->output_type())->New());
  if (!response->ParseFromString(FromByteBuffer(out))) {
    SendError(res, absl::InternalError("the gateway could not read the method's response"));
    return;
  }
  res.set_content(ToJson(*response), "application/json");
}

void HttpGateway::Watch(const httplib::Request& req, httplib::Response& res, const v1::WatchJobRequest& request) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  AddCaller(req, options_.gateway_key, ctx.get());
  auto stub = v1::JobService::NewStub(options_.channel);
  auto reader = stub->WatchJob(ctx.get(), request);
  auto pump = std::make_shared<StreamPump<v1::WatchJobResponse>>(std::move(ctx), std::move(reader));
  v1::WatchJobResponse first;
  grpc::Status status;
  if (!pump->First(&first, &status)) {  // refused before the snapshot: a plain error answer
    SendError(res, status);
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  auto pending = std::make_shared<std::optional<v1::WatchJobResponse>>(std::move(first));
  auto ended = std::make_shared<bool>(false);
  res.set_chunked_content_provider("text/event-stream", [this, pump, pending, ended](size_t, httplib::DataSink& sink) {
    if (stopping_) return false;
    if (*ended) {
      sink.done();
      return true;
    }
    v1::WatchJobResponse m;
    grpc::Status status;
    std::optional<bool> next = true;
    if (pending->has_value()) {
      m = std::move(**pending);
      pending->reset();
    } else {
      next = pump->Next(&m, &status, kKeepAlive);
    }
    std::string out;
    if (!next.has_value()) {
      out = ": keep-alive\n\n";
    } else if (*next) {
      const int64_t id = m.has_event() ? m.event().sequence() : m.snapshot().last_sequence();
      out = absl::StrCat("id: ", id, "\nevent: ", m.has_event() ? "event" : "snapshot", "\ndata: ", ToJson(m), "\n\n");
    } else {
      out = absl::StrCat("event: end\ndata: ", status.ok() ? "{}" : ErrorJson(status), "\n\n");
      *ended = true;
    }
    return sink.write(out.data(), out.size());
  });
}

void HttpGateway::Download(const httplib::Request& req, httplib::Response& res,
                           const v1::DownloadCheckpointRequest& asked) {
  // Range is answered here: httplib must not apply it a second time.
  const_cast<httplib::Request&>(req).ranges.clear();
  v1::DownloadCheckpointRequest request = asked;
  std::optional<std::pair<int64_t, int64_t>> range;
  if (req.has_header("Range")) range = ParseRange(req.get_header_value("Range"));
  if (range) {
    request.set_offset(range->first);
    if (req.has_header("If-Range")) {
      std::string tag = req.get_header_value("If-Range");
      if (tag.size() >= 2 && tag.front() == '"' && tag.back() == '"') tag = tag.substr(1, tag.size() - 2);
      request.set_etag(tag);
    }
  }
  auto ctx = std::make_unique<grpc::ClientContext>();
  AddCaller(req, options_.gateway_key, ctx.get());
  auto stub = v1::JobService::NewStub(options_.channel);
  auto reader = stub->DownloadCheckpoint(ctx.get(), request);
  auto pump = std::make_shared<StreamPump<v1::DownloadCheckpointResponse>>(std::move(ctx), std::move(reader));
  v1::DownloadCheckpointResponse first;
  grpc::Status status;
  if (!pump->First(&first, &status) || !first.has_archive()) {
    if (range && status.error_code() == grpc::StatusCode::ABORTED && !request.etag().empty()) {
      // If-Range named another version: the whole archive (RFC 9110), from the start.
      v1::DownloadCheckpointRequest whole = asked;
      httplib::Request plain = req;
      plain.headers.erase("Range");
      plain.headers.erase("If-Range");
      Download(plain, res, whole);
      return;
    }
    SendError(res, status.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "no archive header") : status);
    return;
  }
  const v1::CheckpointArchive& archive = first.archive();
  const int64_t total = archive.total_bytes();
  int64_t end = total;  // exclusive
  if (range) {
    if (range->first >= total && total > 0) {
      res.status = 416;
      res.set_header("Content-Range", absl::StrCat("bytes */", total));
      return;
    }
    if (range->second >= 0) end = std::min(total, range->second + 1);
    res.status = 206;
    res.set_header("Content-Range", absl::StrCat("bytes ", range->first, "-", end - 1, "/", total));
  }
  res.set_header("ETag", absl::StrCat("\"", archive.etag(), "\""));
  res.set_header("Accept-Ranges", "bytes");
  res.set_header("Content-Disposition", absl::StrCat("attachment; filename=\"", archive.root(), ".tar\""));
  const int64_t start = archive.offset();
  auto buffer = std::make_shared<std::string>();
  res.set_content_provider(static_cast<size_t>(end - start), "application/x-tar",
                           [this, pump, buffer](size_t, size_t length, httplib::DataSink& sink) {
                             if (stopping_) return false;
                             while (buffer->empty()) {
                               v1::DownloadCheckpointResponse m;
                               grpc::Status status;
                               std::optional<bool> next = pump->Next(&m, &status, std::chrono::minutes(5));
                               if (!next.has_value() || !*next)
                                 return false;  // cut short: the client sees a short body
                               *buffer = std::move(*m.mutable_data());
                             }
                             const size_t n = std::min(length, buffer->size());
                             if (!sink.write(buffer->data(), n)) return false;
                             buffer->erase(0, n);
                             return true;
                           });
}

void HttpGateway::Upload(const httplib::Request& req, httplib::Response& res, const HttpMatch& match,
                         const httplib::ContentReader& body) {
  v1::UploadDatasetRequest first;
  std::multimap<std::string, std::string> query(req.params.begin(), req.params.end());
  if (absl::Status s = HttpRoutes::FillRequest(match, query, "", &first); !s.ok()) {
    SendError(res, s);
    return;
  }
  grpc::ClientContext ctx;
  AddCaller(req, options_.gateway_key, &ctx);
  auto stub = v1::DatasetService::NewStub(options_.channel);
  v1::Dataset dataset;
  std::unique_ptr<grpc::ClientWriter<v1::UploadDatasetRequest>> writer = stub->UploadDataset(&ctx, &dataset);
  v1::UploadDatasetRequest message = first;
  bool open = true;
  body([&](const char* data, size_t n) {
    message.mutable_data()->append(data, n);
    if (message.data().size() < kUploadChunk) return true;
    open = writer->Write(message);
    message.Clear();
    return open;  // false: the server has already refused; stop reading
  });
  if (open && (message.ByteSizeLong() > 0)) writer->Write(message);
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) {
    SendError(res, status);
    return;
  }
  res.set_content(ToJson(dataset), "application/json");
}

}  // namespace oomb::server
