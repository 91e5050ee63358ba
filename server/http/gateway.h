// The HTTP/JSON face of the daemon (http.listen; proto/oomb/v1/jobs.proto, "HTTP/JSON"): every
// method with a google.api.http rule, transcoded (server/http/http_rules.h) and called on the
// daemon's own gRPC server through an in-process channel, so that each HTTP request meets exactly
// the checks, authorization and errors a gRPC call does. The transport is server/http/http_server.h:
// an event loop no client can hold (caps on connections per client and in all, header and body
// deadlines), over TLS with the daemon's certificate when tls.cert_file is set, demanding a client
// certificate when tls.client_ca_file is (401 without one).
//
// Who calls: the `Authorization: Bearer <token>` header is passed on as the call's metadata; a
// verified client certificate's subject, and the HTTP peer's address, travel in metadata that
// carries the daemon's per-process gateway key, which the Authenticator alone believes
// (server/auth.h). Nothing else of the HTTP request reaches the service.
//
// Answers, by the method's shape as server/http/http_rules.h reads it from the proto (never by
// its name):
//   - a unary method: 200 and the response message as JSON (the proto3 JSON mapping);
//   - an error: the HTTP status of AIP-193 for the gRPC code, and
//     {"error": {"code", "message", "status", "details"}} with the details of the gRPC status
//     (google.rpc.ErrorInfo with the reason, google.rpc.BadRequest with the field) as JSON;
//     no route: 404 (405 when the path exists for another method), NOT_FOUND-shaped;
//   - a server stream of messages (HttpAnswer::kEvents; WatchJob): text/event-stream, an event per
//     message (`event:` the oneof member it carries, snapshot or event; `id:` that member's
//     sequence, or last_sequence, when it has one: HttpEvent; `data:` the message as JSON);
//     `Last-Event-ID` sets the request's after_sequence where it has one (resuming; the query's
//     after_sequence does too); a comment line every 15 s keeps idle proxies from closing it; the
//     stream's end status comes as a last `event: end` with the error object (if any);
//   - a server stream of bytes (HttpAnswer::kBytes, HttpByteStream; DownloadCheckpoint): its
//     content as the body, application/x-tar for a checkpoint's archive (CheckpointArchive
//     header; application/octet-stream for another header type), Content-Length from the
//     header's total_bytes, the header's etag as ETag, its root as the file name; `Range:
//     bytes=N-`, `N-M` or `-S` (the last S bytes) answers 206 with Content-Range (the request's
//     offset and etag ask the service for that part), unless `If-Range` names another etag (then
//     200 and all of it); a range starting past the end, or `-0`, answers 416 with
//     `Content-Range: bytes */<size>`;
//   - a client stream (UploadDataset): the PUT body streamed into the request's bytes field the
//     rule's body names, in messages of 1 MiB, as it arrives, at most 4 MiB of it waiting at a
//     time (the client is not read further until the service takes it); the other fields (path,
//     query) in the first message; the response as JSON;
//   - GET /v1/openapi.json: the OpenAPI document of the API (server/http/openapi.h);
//   - GET /healthz: the daemon's grpc.health.v1 status as JSON ({"status": "SERVING"}; 503 when
//     not serving), without a token, for load balancers and probes.
// Bodies of unary requests are at most 4 MiB (413 beyond); a request's call has a 5-minute
// deadline (streams none). A project has at most max_streams_per_project watches and downloads
// open over HTTP at once (429 RESOURCE_EXHAUSTED beyond, naming http.max_streams_per_project).
//
// Thread-safety: Start and Stop from one thread; requests are served on the event loop's threads
// and gRPC's.
#ifndef OOMB_SERVER_HTTP_GATEWAY_H_
#define OOMB_SERVER_HTTP_GATEWAY_H_

#include <grpcpp/channel.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "oomb/v1/datasets.pb.h"
#include "oomb/v1/jobs.pb.h"
#include "server/http/http_rules.h"
#include "server/http/http_server.h"

namespace oomb::server {

// The routes of the API's services (oomb.v1.JobService, oomb.v1.DatasetService): what the
// gateway serves and the OpenAPI document describes.
absl::StatusOr<HttpRoutes> ApiRoutes();

// One range of a Range header (RFC 9110 §14.1.2): "bytes=N-", "bytes=N-M" or "bytes=-S".
struct HttpByteRange {
  int64_t first = 0, last = -1;  // last -1: to the end
  int64_t suffix = -1;           // >= 0: the last `suffix` bytes (first and last unused)
};

// A server stream read on a thread of its own (gateway.cc).
class StreamPump;

struct HttpGatewayOptions {
  // listen, TLS files, connection caps and deadlines (the daemon's http.* and tls.* settings).
  HttpServerOptions server;
  // The daemon's gRPC server, in-process (grpc::Server::InProcessChannel).
  std::shared_ptr<grpc::Channel> channel;
  // The per-process secret the Authenticator believes (AuthOptions::gateway_key).
  std::string gateway_key;
  int max_streams_per_project = 32;  // 0: no limit
};

class HttpGateway : private HttpHandler {
 public:
  // Builds the routes and binds the port; UNAVAILABLE naming http.listen when it cannot be
  // bound, INVALID_ARGUMENT when the TLS files do not load. Serves until Stop.
  static absl::StatusOr<std::unique_ptr<HttpGateway>> Start(HttpGatewayOptions options);
  ~HttpGateway() override;  // Stop()
  HttpGateway(const HttpGateway&) = delete;
  HttpGateway& operator=(const HttpGateway&) = delete;

  int port() const;
  // Stops accepting, ends open streams and calls, waits for uploads in flight to end.
  void Stop();

 private:
  class StreamSlots;
  struct UploadPipe;
  struct DownloadPlan {
    const HttpRoute* route = nullptr;                        // a kBytes route
    std::string project;                                     // whose stream slot it takes
    std::shared_ptr<const google::protobuf::Message> asked;  // the request, as the client made it
    std::optional<HttpByteRange> range;
    std::string if_range;  // If-Range's etag, with a range
    bool probing = false;  // asked from the start only to learn the size a 416 names
  };
  HttpGateway(HttpGatewayOptions options, HttpRoutes routes);
  bool StreamsBody(const HttpRequest& request) override;
  void Serve(const std::shared_ptr<HttpCall>& call) override;
  void Unary(const std::shared_ptr<HttpCall>& call, const google::protobuf::MethodDescriptor* method,
             const google::protobuf::Message& request);
  void Health(const std::shared_ptr<HttpCall>& call);
  void Events(const std::shared_ptr<HttpCall>& call, const HttpMatch& match, const google::protobuf::Message& request);
  void Download(const std::shared_ptr<HttpCall>& call, DownloadPlan plan);
  void AnswerDownload(HttpCall& call, const DownloadPlan& plan, const google::protobuf::Message& header,
                      std::shared_ptr<StreamPump> pump);
  void Upload(const std::shared_ptr<HttpCall>& call, const HttpMatch& match);
  void WriteUpload(HttpCall& call, UploadPipe& pipe, const HttpRoute& route, const google::protobuf::Message& first);
  grpc::Status TooManyStreams(const std::string& project) const;

  const HttpGatewayOptions options_;
  const HttpRoutes routes_;
  const std::unique_ptr<StreamSlots> streams_;
  std::unique_ptr<HttpServer> server_;
  std::mutex uploads_mu_;
  std::condition_variable uploads_cv_;
  int uploads_ = 0;  // upload writers running
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_HTTP_GATEWAY_H_
