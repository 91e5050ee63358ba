#include "server/http/gateway.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "google/rpc/status.pb.h"
#include "grpc/health/v1/health.pb.h"
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

constexpr auto kUnaryDeadline = std::chrono::minutes(5);
constexpr auto kKeepAlive = std::chrono::seconds(15);
constexpr size_t kUploadChunk = size_t{1} << 20;  // bytes per UploadDatasetRequest
constexpr size_t kUploadQueue = size_t{4} << 20;  // bytes of an upload waiting for the service

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

void SendError(HttpCall& call, const grpc::Status& s, int http = 0,
               std::vector<std::pair<std::string, std::string>> headers = {}) {
  call.Respond(http != 0 ? http : HttpStatus(s.error_code()), "application/json", ErrorJson(s, http),
               std::move(headers));
}

void SendError(HttpCall& call, const absl::Status& s, int http = 0) { SendError(call, ToGrpcStatus(s), http); }

std::string FromByteBuffer(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!b.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// What the service learns of the HTTP caller (see the file comment of gateway.h).
void AddCaller(const HttpRequest& req, const std::string& key, grpc::ClientContext* ctx) {
  if (req.HasHeader("authorization")) ctx->AddMetadata("authorization", req.Header("authorization"));
  ctx->AddMetadata(kGatewayKeyMetadata, key);
  ctx->AddMetadata(kGatewayPeerMetadata, req.peer);
  if (!req.cert_subject.empty()) ctx->AddMetadata(kGatewaySubjectMetadata, req.cert_subject);
  if (!req.cert_cn.empty()) ctx->AddMetadata(kGatewayCommonNameMetadata, req.cert_cn);
}

}  // namespace

// A server stream, any method's (its messages of the method's output type, made from the
// generated pool's prototype), read on a thread of its own into a bounded queue, which the HTTP
// side drains without blocking; each message (and the end) wakes the call. Destroying it cancels
// the call.
class StreamPump {
 public:
  StreamPump(const std::shared_ptr<grpc::Channel>& channel, const google::protobuf::MethodDescriptor* method,
             std::unique_ptr<grpc::ClientContext> ctx, const Message& request, std::shared_ptr<HttpWaker> waker)
      : ctx_(std::move(ctx)),
        path_(absl::StrCat("/", method->service()->full_name(), "/", method->name())),
        prototype_(google::protobuf::MessageFactory::generated_factory()->GetPrototype(method->output_type())),
        waker_(std::move(waker)) {
    const grpc::internal::RpcMethod rpc(path_.c_str(), grpc::internal::RpcMethod::SERVER_STREAMING, channel);
    reader_.reset(grpc::internal::ClientReaderFactory<Message>::Create(channel.get(), rpc, ctx_.get(), request));
    thread_ = std::thread([this] { Run(); });
  }
  ~StreamPump() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      cv_.notify_all();
    }
    ctx_->TryCancel();
    thread_.join();
  }
  // The next message: true with `out` set; false at the end (`status` then set); nullopt when
  // none has come yet.
  std::optional<bool> TryNext(std::unique_ptr<Message>* out, grpc::Status* status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!queue_.empty()) {
      *out = std::move(queue_.front());
      queue_.pop_front();
      cv_.notify_all();
      return true;
    }
    if (!done_) return std::nullopt;
    *status = status_;
    return false;
  }

 private:
  static constexpr size_t kMaxQueued = 16;  // back-pressure: the reader waits for the HTTP side
  void Run() {
    for (;;) {
      std::unique_ptr<Message> m(prototype_->New());
      if (!reader_->Read(m.get())) break;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return queue_.size() < kMaxQueued || cancelled_; });
        if (cancelled_) break;
        queue_.push_back(std::move(m));
      }
      waker_->Wake();
    }
    grpc::Status s = reader_->Finish();
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = s;
      done_ = true;
    }
    waker_->Wake();
  }

  std::unique_ptr<grpc::ClientContext> ctx_;
  const std::string path_;  // "/oomb.v1.JobService/WatchJob": the RpcMethod holds a pointer to it
  const Message* const prototype_;
  std::unique_ptr<grpc::ClientReader<Message>> reader_;
  const std::shared_ptr<HttpWaker> waker_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Message>> queue_;
  bool done_ = false, cancelled_ = false;
  grpc::Status status_;
};

namespace {

// "projects/{p}/..." -> p; "" for another name.
std::string ProjectOf(const std::string& name) {
  if (!absl::StartsWith(name, "projects/")) return "";
  const size_t end = name.find('/', 9);
  return name.substr(9, end == std::string::npos ? std::string::npos : end - 9);
}

// nullopt for none or a form not served (several ranges, another unit, bad syntax): the whole
// archive is sent, as RFC 9110 lets a server ignore such a Range.
std::optional<HttpByteRange> ParseRange(const std::string& header) {
  if (!absl::StartsWith(header, "bytes=") || header.find(',') != std::string::npos) return std::nullopt;
  const std::string spec = header.substr(6);
  const size_t dash = spec.find('-');
  if (dash == std::string::npos) return std::nullopt;
  HttpByteRange r;
  if (dash == 0) {
    if (!absl::SimpleAtoi(spec.substr(1), &r.suffix) || r.suffix < 0) return std::nullopt;
    return r;
  }
  if (!absl::SimpleAtoi(spec.substr(0, dash), &r.first) || r.first < 0) return std::nullopt;
  if (dash + 1 < spec.size() && !absl::SimpleAtoi(spec.substr(dash + 1), &r.last)) return std::nullopt;
  if (r.last >= 0 && r.last < r.first) return std::nullopt;
  return r;
}

// Copies what is left of `text` from `*offset` into the producer's buffer.
ssize_t CopyOut(const std::string& text, size_t* offset, char* buffer, size_t max) {
  const size_t n = std::min(max, text.size() - *offset);
  std::memcpy(buffer, text.data() + *offset, n);
  *offset += n;
  return static_cast<ssize_t>(n);
}

// A server stream's answer as server-sent events (gateway.h): an event per message, a keep-alive
// comment when none came for kKeepAlive, `event: end` last.
struct SseStream {
  std::shared_ptr<StreamPump> pump;
  std::shared_ptr<void> slot;  // the project's stream slot, held while the stream is open
  std::shared_ptr<HttpWaker> waker;
  std::unique_ptr<Message> pending;  // the first message, read before the headers
  std::string out;
  size_t sent = 0;
  bool ended = false;
  std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();

  ssize_t Next(char* buffer, size_t max) {
    if (sent < out.size()) return CopyOut(out, &sent, buffer, max);
    if (ended) return kStreamEnd;
    std::unique_ptr<Message> m = std::move(pending);
    grpc::Status status;
    std::optional<bool> next = true;
    if (m == nullptr) next = pump->TryNext(&m, &status);
    const auto now = std::chrono::steady_clock::now();
    if (!next.has_value()) {
      if (now - last < kKeepAlive) {
        waker->WakeAt(last + kKeepAlive);
        return kStreamWait;
      }
      out = ": keep-alive\n\n";
    } else if (*next) {
      const HttpEvent e = EventOf(*m);
      out = absl::StrCat(e.id ? absl::StrCat("id: ", *e.id, "\n") : "", "event: ", e.name, "\ndata: ", ToJson(*m),
                         "\n\n");
    } else {
      out = absl::StrCat("event: end\ndata: ", status.ok() ? "{}" : ErrorJson(status), "\n\n");
      ended = true;
    }
    last = now;
    sent = 0;
    return CopyOut(out, &sent, buffer, max);
  }
};

// A byte stream's answer: the content's bytes (the route's `data` field) from the pump, `length`
// of them; cut short (the client sees a short body) when the stream ends first.
struct DownloadStream {
  std::shared_ptr<StreamPump> pump;
  const google::protobuf::FieldDescriptor* data = nullptr;
  std::shared_ptr<void> slot;
  std::string buffer;
  size_t sent = 0;

  ssize_t Next(char* out, size_t max) {
    while (sent >= buffer.size()) {
      std::unique_ptr<Message> m;
      grpc::Status status;
      std::optional<bool> next = pump->TryNext(&m, &status);
      if (!next.has_value()) return kStreamWait;
      if (!*next) return kStreamAbort;
      buffer = m->GetReflection()->GetString(*m, data);
      sent = 0;
    }
    return CopyOut(buffer, &sent, out, max);
  }
};

// The project a match's resource names ("projects/{p}/..." in its first path variable); "".
std::string ProjectOf(const HttpMatch& match) {
  return match.bindings.empty() ? "" : ProjectOf(match.bindings.front().second);
}

}  // namespace

// Open streams (SSE watches, downloads) per project, at most `max` each.
class HttpGateway::StreamSlots {
 public:
  explicit StreamSlots(int max) : max_(max) {}
  // A slot of `project`'s, released when the returned pointer goes; null when all are taken.
  std::shared_ptr<void> Acquire(const std::string& project) {
    std::lock_guard<std::mutex> lock(mu_);
    int& open = open_[project];
    if (max_ > 0 && open >= max_) return nullptr;
    ++open;
    return std::shared_ptr<void>(this, [this, project](void*) {  // not null: held
      std::lock_guard<std::mutex> lock(mu_);
      if (--open_[project] == 0) open_.erase(project);
    });
  }
  int max() const { return max_; }

 private:
  const int max_;
  std::mutex mu_;
  std::map<std::string, int> open_;
};

absl::StatusOr<HttpRoutes> ApiRoutes() {
  return HttpRoutes::FromServices({v1::Job::descriptor()->file()->FindServiceByName("JobService"),
                                   v1::Dataset::descriptor()->file()->FindServiceByName("DatasetService")});
}

HttpGateway::HttpGateway(HttpGatewayOptions options, HttpRoutes routes)
    : options_(std::move(options)),
      routes_(std::move(routes)),
      streams_(std::make_unique<StreamSlots>(options_.max_streams_per_project)) {}

HttpGateway::~HttpGateway() { Stop(); }

void HttpGateway::Stop() {
  if (server_ != nullptr) server_->Stop();
  // Every upload's connection is closed by now, which ends its writer: wait for them.
  std::unique_lock<std::mutex> lock(uploads_mu_);
  uploads_cv_.wait(lock, [&] { return uploads_ == 0; });
}

int HttpGateway::port() const { return server_ != nullptr ? server_->port() : 0; }

absl::StatusOr<std::unique_ptr<HttpGateway>> HttpGateway::Start(HttpGatewayOptions options) {
  OOMB_ASSIGN_OR_RETURN(HttpRoutes routes, ApiRoutes());
  std::unique_ptr<HttpGateway> g(new HttpGateway(std::move(options), std::move(routes)));
  OOMB_ASSIGN_OR_RETURN(g->server_, HttpServer::Start(g->options_.server, g.get()));
  return g;
}

bool HttpGateway::StreamsBody(const HttpRequest& request) {
  std::optional<HttpMatch> match = routes_.Find(request.method, request.path);
  return match && match->route->method->client_streaming();
}

void HttpGateway::Serve(const std::shared_ptr<HttpCall>& call) {
  const HttpRequest& req = call->request();
  if (req.certificate_missing) {
    SendError(*call, grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                  "a client certificate signed by tls.client_ca_file is required"));
    return;
  }
  if (req.body_too_large) {
    SendError(*call,
              absl::InvalidArgumentError(
                  absl::StrCat("the request body is larger than ", options_.server.max_buffered_body, " bytes")),
              413);
    return;
  }
  if (req.method == "GET" && req.path == "/v1/openapi.json") {
    call->Respond(200, "application/json", OpenApiDocument(routes_));
    return;
  }
  if (req.method == "GET" && req.path == "/healthz") {
    Health(call);
    return;
  }
  std::optional<HttpMatch> match = routes_.Find(req.method, req.path);
  if (!match) {
    const bool known = routes_.PathKnown(req.path);
    SendError(*call,
              grpc::Status(grpc::StatusCode::NOT_FOUND,
                           absl::StrCat(known ? "no method " + req.method + " on " : "no route ", Excerpt(req.path))),
              known ? 405 : 404);
    return;
  }
  const HttpRoute& route = *match->route;
  if (route.body_stream != nullptr) {
    Upload(call, *match);
    return;
  }
  std::shared_ptr<Message> request(
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(route.method->input_type())->New());
  std::multimap<std::string, std::string> query = req.query;
  if (route.resume != nullptr && req.HasHeader("last-event-id")) {
    query.erase(route.resume->name());
    query.emplace(route.resume->name(), req.Header("last-event-id"));
  }
  if (absl::Status s = HttpRoutes::FillRequest(*match, query, req.body, request.get()); !s.ok()) {
    SendError(*call, s);
    return;
  }
  switch (route.answer) {
    case HttpAnswer::kJson:
      Unary(call, route.method, *request);
      return;
    case HttpAnswer::kEvents:
      Events(call, *match, *request);
      return;
    case HttpAnswer::kBytes:
      break;
  }
  DownloadPlan plan;
  plan.route = &route;
  plan.project = ProjectOf(*match);
  plan.asked = std::move(request);
  if (req.HasHeader("range")) plan.range = ParseRange(req.Header("range"));
  if (plan.range && req.HasHeader("if-range")) {
    std::string tag = req.Header("if-range");
    if (tag.size() >= 2 && tag.front() == '"' && tag.back() == '"') tag = tag.substr(1, tag.size() - 2);
    plan.if_range = tag;
  }
  Download(call, std::move(plan));
}

void HttpGateway::Unary(const std::shared_ptr<HttpCall>& call, const google::protobuf::MethodDescriptor* method,
                        const Message& request) {
  struct State {
    grpc::ClientContext ctx;
    grpc::ByteBuffer in, out;
    std::unique_ptr<grpc::GenericStub> stub;
  };
  auto st = std::make_shared<State>();
  st->ctx.set_deadline(std::chrono::system_clock::now() + kUnaryDeadline);
  AddCaller(call->request(), options_.gateway_key, &st->ctx);
  const std::string bytes = request.SerializeAsString();
  grpc::Slice slice(bytes);
  st->in = grpc::ByteBuffer(&slice, 1);
  st->stub = std::make_unique<grpc::GenericStub>(options_.channel);
  // The call waits in the event loop (suspended), not on a thread; gRPC's callback answers it.
  st->stub->UnaryCall(
      &st->ctx, absl::StrCat("/", method->service()->full_name(), "/", method->name()), grpc::StubOptions(), &st->in,
      &st->out, [st, call, method](grpc::Status status) {
        if (!status.ok()) {
          SendError(*call, status);
          return;
        }
        std::unique_ptr<Message> response(
            google::protobuf::MessageFactory::generated_factory()->GetPrototype(method->output_type())->New());
        if (!response->ParseFromString(FromByteBuffer(st->out))) {
          SendError(*call, absl::InternalError("the gateway could not read the method's response"));
          return;
        }
        call->Respond(200, "application/json", ToJson(*response));
      });
}

void HttpGateway::Health(const std::shared_ptr<HttpCall>& call) {
  const google::protobuf::MethodDescriptor* check =
      grpc::health::v1::HealthCheckRequest::descriptor()->file()->FindServiceByName("Health")->FindMethodByName(
          "Check");
  Unary(call, check, grpc::health::v1::HealthCheckRequest());
}

void HttpGateway::Events(const std::shared_ptr<HttpCall>& call, const HttpMatch& match, const Message& request) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  AddCaller(call->request(), options_.gateway_key, ctx.get());
  auto pump =
      std::make_shared<StreamPump>(options_.channel, match.route->method, std::move(ctx), request, call->waker());
  // Runs (event loop) until the first message or the refusal has come; the call outlives it.
  call->SetPoll([this, c = call.get(), pump, project = ProjectOf(match)] {
    std::unique_ptr<Message> first;
    grpc::Status status;
    std::optional<bool> got = pump->TryNext(&first, &status);
    if (!got.has_value()) return;
    if (!*got) {  // refused before the first message: a plain error answer
      SendError(*c, status);
      return;
    }
    std::shared_ptr<void> slot = streams_->Acquire(project);
    if (slot == nullptr) {
      SendError(*c, TooManyStreams(project));
      return;
    }
    auto sse = std::make_shared<SseStream>();
    sse->pump = pump;
    sse->slot = std::move(slot);
    sse->waker = c->waker();
    sse->pending = std::move(first);
    c->RespondStream(200, "text/event-stream", -1, [sse](char* buffer, size_t max) { return sse->Next(buffer, max); },
                     {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}});
  });
}

grpc::Status HttpGateway::TooManyStreams(const std::string& project) const {
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      absl::StrCat("project '", project, "' has ", streams_->max(),
                                   " streams open (watches and downloads over HTTP; http.max_streams_per_project)"));
}

void HttpGateway::Download(const std::shared_ptr<HttpCall>& call, DownloadPlan plan) {
  const HttpByteStream& fields = plan.route->bytes;
  std::unique_ptr<Message> request(plan.asked->New());
  request->CopyFrom(*plan.asked);
  const google::protobuf::Reflection* r = request->GetReflection();
  // A suffix range, or the size a 416 names, needs the content's size first: asked from 0.
  const bool from_start = !plan.range || plan.range->suffix >= 0 || plan.probing;
  if (!from_start) r->SetInt64(request.get(), fields.request_offset, plan.range->first);
  if (plan.range) r->SetString(request.get(), fields.request_etag, plan.if_range);
  auto ctx = std::make_unique<grpc::ClientContext>();
  AddCaller(call->request(), options_.gateway_key, ctx.get());
  auto pump =
      std::make_shared<StreamPump>(options_.channel, plan.route->method, std::move(ctx), *request, call->waker());
  call->SetPoll([this, c = call.get(), pump, plan] {
    std::unique_ptr<Message> first;
    grpc::Status status;
    std::optional<bool> got = pump->TryNext(&first, &status);
    if (!got.has_value()) return;
    const HttpByteStream& fields = plan.route->bytes;
    if (!*got || !first->GetReflection()->HasField(*first, fields.header)) {
      if (plan.range && status.error_code() == grpc::StatusCode::ABORTED && !plan.if_range.empty()) {
        DownloadPlan whole;
        whole.route = plan.route;
        whole.project = plan.project;
        whole.asked = plan.asked;
        Download(c->shared_from_this(), std::move(whole));  // If-Range named another version: all of it
      } else if (plan.range && status.error_code() == grpc::StatusCode::OUT_OF_RANGE && !plan.probing) {
        DownloadPlan probe = plan;  // past the end: 416 naming the size, learnt from the start
        probe.probing = true;
        Download(c->shared_from_this(), std::move(probe));
      } else {
        SendError(*c, status.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "no header first") : status);
      }
      return;
    }
    AnswerDownload(*c, plan, first->GetReflection()->GetMessage(*first, fields.header), pump);
  });
}

void HttpGateway::AnswerDownload(HttpCall& call, const DownloadPlan& plan, const Message& header,
                                 std::shared_ptr<StreamPump> pump) {
  const HttpByteStream& fields = plan.route->bytes;
  const google::protobuf::Reflection* hr = header.GetReflection();
  const int64_t total = hr->GetInt64(header, fields.total_bytes);
  const int64_t offset = hr->GetInt64(header, fields.offset);
  const std::string etag = hr->GetString(header, fields.etag);
  std::vector<std::pair<std::string, std::string>> headers = {{"ETag", absl::StrCat("\"", etag, "\"")},
                                                              {"Accept-Ranges", "bytes"}};
  const auto [media_type, suffix] = MediaOf(fields);
  if (fields.root != nullptr) {
    headers.emplace_back("Content-Disposition",
                         absl::StrCat("attachment; filename=\"", hr->GetString(header, fields.root), suffix, "\""));
  }
  int status = 200;
  int64_t start = offset, end = total;  // end exclusive
  if (plan.range) {
    HttpByteRange r = *plan.range;
    if (r.suffix >= 0 && r.suffix < total && offset == 0 && !plan.probing) {
      DownloadPlan rest = plan;  // the last S bytes: asked again from there, of this version only
      rest.range = HttpByteRange{total - r.suffix, -1, -1};
      rest.if_range = etag;
      Download(call.shared_from_this(), std::move(rest));
      return;
    }
    if (r.suffix >= 0) r.first = 0;  // the last S >= size bytes: all of them
    if (plan.probing || r.suffix == 0 || (r.first >= total && total > 0)) {
      SendError(call,
                grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                             absl::StrCat("the range is outside the content's ", total, " bytes")),
                416, {{"Content-Range", absl::StrCat("bytes */", total)}});
      return;
    }
    if (r.last >= 0) end = std::min(total, r.last + 1);
    status = 206;
    headers.emplace_back("Content-Range", absl::StrCat("bytes ", start, "-", end - 1, "/", total));
  }
  std::shared_ptr<void> slot = streams_->Acquire(plan.project);
  if (slot == nullptr) {
    SendError(call, TooManyStreams(plan.project));
    return;
  }
  auto stream = std::make_shared<DownloadStream>();
  stream->pump = std::move(pump);
  stream->data = fields.data;
  stream->slot = std::move(slot);
  call.RespondStream(
      status, media_type, end - start, [stream](char* buffer, size_t max) { return stream->Next(buffer, max); },
      std::move(headers));
}

// An upload's body, handed from the event loop to the thread that writes it into the gRPC
// client stream; at most kUploadQueue bytes wait between them.
struct HttpGateway::UploadPipe {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> pieces;
  size_t queued = 0;
  bool end = false, closed = false, refused = false;
};

void HttpGateway::Upload(const std::shared_ptr<HttpCall>& call, const HttpMatch& match) {
  std::shared_ptr<Message> first(
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(match.route->method->input_type())->New());
  if (absl::Status s = HttpRoutes::FillRequest(match, call->request().query, "", first.get()); !s.ok()) {
    SendError(*call, s);  // no sink: the body is read and dropped
    return;
  }
  auto pipe = std::make_shared<UploadPipe>();
  std::shared_ptr<HttpWaker> waker = call->waker();
  call->SetBodySink(
      [pipe](absl::string_view piece) -> size_t {
        std::lock_guard<std::mutex> lock(pipe->mu);
        if (pipe->refused) return piece.size();  // the service refused: dropped
        if (pipe->queued >= kUploadQueue) return 0;
        const size_t n = std::min(piece.size(), kUploadQueue - pipe->queued);
        pipe->pieces.emplace_back(piece.substr(0, n));
        pipe->queued += n;
        pipe->cv.notify_all();
        return n;
      },
      [pipe] {
        std::lock_guard<std::mutex> lock(pipe->mu);
        pipe->end = true;
        pipe->cv.notify_all();
      });
  call->OnClose([pipe] {
    std::lock_guard<std::mutex> lock(pipe->mu);
    pipe->closed = true;
    pipe->cv.notify_all();
  });
  {
    std::lock_guard<std::mutex> lock(uploads_mu_);
    ++uploads_;
  }
  std::thread([this, call, pipe, first, route = match.route] {
    WriteUpload(*call, *pipe, *route, *first);
    std::lock_guard<std::mutex> lock(uploads_mu_);
    --uploads_;
    uploads_cv_.notify_all();
  }).detach();
}

void HttpGateway::WriteUpload(HttpCall& call, UploadPipe& pipe, const HttpRoute& route, const Message& first) {
  grpc::ClientContext ctx;
  AddCaller(call.request(), options_.gateway_key, &ctx);
  const google::protobuf::MethodDescriptor* method = route.method;
  const std::string path = absl::StrCat("/", method->service()->full_name(), "/", method->name());
  const grpc::internal::RpcMethod rpc(path.c_str(), grpc::internal::RpcMethod::CLIENT_STREAMING, options_.channel);
  std::unique_ptr<Message> response(
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(method->output_type())->New());
  std::unique_ptr<grpc::ClientWriter<Message>> writer(
      grpc::internal::ClientWriterFactory<Message>::Create(options_.channel.get(), rpc, &ctx, response.get()));
  std::unique_ptr<Message> message(first.New());
  message->CopyFrom(first);
  const google::protobuf::Reflection* r = message->GetReflection();
  std::string data;  // the bytes field's next piece, moved in when kUploadChunk is reached
  bool open = true;
  for (;;) {
    std::string piece;
    {
      std::unique_lock<std::mutex> lock(pipe.mu);
      pipe.cv.wait(lock, [&] { return !pipe.pieces.empty() || pipe.end || pipe.closed; });
      if (pipe.closed && !pipe.end) {
        ctx.TryCancel();  // the client went away mid-body
        open = false;
        break;
      }
      if (pipe.pieces.empty()) break;  // the body is complete
      piece = std::move(pipe.pieces.front());
      pipe.pieces.pop_front();
      pipe.queued -= piece.size();
    }
    call.waker()->Wake();  // room again
    data.append(piece);
    if (data.size() < kUploadChunk) continue;
    r->SetString(message.get(), route.body_stream, std::move(data));
    data.clear();
    open = writer->Write(*message);
    message->Clear();
    if (!open) break;  // the server has refused already
  }
  if (!open) {
    std::lock_guard<std::mutex> lock(pipe.mu);
    pipe.refused = true;
    pipe.pieces.clear();
    pipe.queued = 0;
  }
  call.waker()->Wake();
  if (!data.empty()) r->SetString(message.get(), route.body_stream, std::move(data));
  if (open && message->ByteSizeLong() > 0) writer->Write(*message);
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) {
    SendError(call, status);
    return;
  }
  call.Respond(200, "application/json", ToJson(*response));
}

}  // namespace oomb::server
