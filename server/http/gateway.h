// The HTTP/JSON face of the daemon (http.listen; proto/oomb/v1/jobs.proto, "HTTP/JSON"): every
// method with a google.api.http rule, transcoded (server/http/http_rules.h) and called on the
// daemon's own gRPC server through an in-process channel, so that each HTTP request meets exactly
// the checks, authorization and errors a gRPC call does. The server is cpp-httplib's (a thread per
// connection from a bounded pool), over TLS with the daemon's certificate when tls.cert_file is
// set, demanding a client certificate when tls.client_ca_file is.
//
// Who calls: the `Authorization: Bearer <token>` header is passed on as the call's metadata; a
// verified client certificate's subject, and the HTTP peer's address, travel in metadata that
// carries the daemon's per-process gateway key, which the Authenticator alone believes
// (server/auth.h). Nothing else of the HTTP request reaches the service.
//
// Answers:
//   - a unary method: 200 and the response message as JSON (the proto3 JSON mapping);
//   - an error: the HTTP status of AIP-193 for the gRPC code, and
//     {"error": {"code", "message", "status", "details"}} with the details of the gRPC status
//     (google.rpc.ErrorInfo with the reason, google.rpc.BadRequest with the field) as JSON;
//     no route: 404 (405 when the path exists for another method), NOT_FOUND-shaped;
//   - WatchJob: text/event-stream, an event per message (`id:` the JobEvent's sequence, `event:`
//     snapshot or event, `data:` the WatchJobResponse as JSON); `Last-Event-ID` (or the query's
//     after_sequence) resumes; a comment line every 15 s keeps idle proxies from closing it; the
//     stream's end status comes as a last `event: end` with the error object (if any);
//   - DownloadCheckpoint: application/x-tar, the archive's bytes; `Range: bytes=N-` (or N-M)
//     answers 206 with Content-Range from byte N, unless `If-Range` names another etag; the
//     checkpoint's etag is the ETag header;
//   - UploadDataset: the PUT body streamed into the client stream as it arrives.
//   - GET /v1/openapi.json: the OpenAPI document of the API (server/http/openapi.h).
// Bodies of unary requests are at most 4 MiB (413 beyond); a request's call has a 5-minute
// deadline (streams none).
//
// Thread-safety: Start and Stop from one thread; requests are served on the pool's threads.
#ifndef OOMB_SERVER_HTTP_GATEWAY_H_
#define OOMB_SERVER_HTTP_GATEWAY_H_

#include <grpcpp/channel.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "oomb/v1/jobs.pb.h"
#include "server/http/http_rules.h"

namespace httplib {
class Server;
class ContentReader;
struct Request;
struct Response;
}  // namespace httplib

namespace oomb::server {

// The routes of the API's services (oomb.v1.JobService, oomb.v1.DatasetService): what the
// gateway serves and the OpenAPI document describes.
absl::StatusOr<HttpRoutes> ApiRoutes();

struct HttpGatewayOptions {
  std::string listen;  // host:port; port 0 picks one (port())
  // TLS (tls.*): all empty for plain HTTP. With client_ca_file, clients must present a
  // certificate it signed.
  std::string cert_file, key_file, client_ca_file;
  // The daemon's gRPC server, in-process (grpc::Server::InProcessChannel).
  std::shared_ptr<grpc::Channel> channel;
  // The per-process secret the Authenticator believes (AuthOptions::gateway_key).
  std::string gateway_key;
  // Requests served at once (each stream holds one until it ends).
  int threads = 64;
};

class HttpGateway {
 public:
  // Builds the routes and binds the port; UNAVAILABLE naming http.listen when it cannot be
  // bound, INVALID_ARGUMENT when the TLS files do not load. Serves until Stop.
  static absl::StatusOr<std::unique_ptr<HttpGateway>> Start(HttpGatewayOptions options);
  ~HttpGateway();  // Stop()
  HttpGateway(const HttpGateway&) = delete;
  HttpGateway& operator=(const HttpGateway&) = delete;

  int port() const { return port_; }
  // Stops accepting, ends open streams at their next write, joins the serving thread.
  void Stop();

 private:
  HttpGateway(HttpGatewayOptions options, HttpRoutes routes);
  // A unary method, or the routing of a streaming one to the three below.
  void Handle(const httplib::Request& req, httplib::Response& res, const std::string& body);
  void Watch(const httplib::Request& req, httplib::Response& res, const v1::WatchJobRequest& request);
  void Download(const httplib::Request& req, httplib::Response& res, const v1::DownloadCheckpointRequest& request);
  void Upload(const httplib::Request& req, httplib::Response& res, const HttpMatch& match,
              const httplib::ContentReader& body);

  const HttpGatewayOptions options_;
  const HttpRoutes routes_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};  // Stop(): open streams end at their next write
  int port_ = 0;
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_HTTP_GATEWAY_H_
