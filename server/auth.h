// Who is calling, and what they may touch (proto/oomb/v1/jobs.proto, "Callers and projects").
//
// Identities, after Kubernetes authentication:
//   - auth.tokens_file: a static token file, one identity a line, `token,user,uid,"g1,g2"` (CSV;
//     the groups column optional; blank lines and lines starting with '#' skipped). Re-read when
//     it changes (its inode, size or modification time), at most once a second, so that adding
//     a team or revoking a token takes effect without a restart. A file that no longer parses
//     keeps the identities read before and is logged (UNAUTHENTICATED if none were ever read).
//   - auth.token (or auth.token_file): one token, one identity: user "admin" in oomb:admins.
//   - an mTLS client certificate (tls.client_ca_file): its subject's CN is the user and its O
//     entries are the groups. Used when the call carries no bearer token.
//   - with certificates only, a call on the Unix socket (mode 0600: the daemon's user) is user
//     "unix", an administrator;
//   - nothing configured: every caller is an administrator with no user (one user, as before).
// Projects: a caller may act in the projects its groups name (a group that is a valid project
// name, [a-z0-9][a-z0-9-]{0,62}); the group `oomb:admins` may act in every project.
//
// Calls from the HTTP gateway (server/http/gateway.h) come through an in-process channel. What
// the gateway verified of its HTTP caller travels as metadata beside the per-process gateway key
// (AuthOptions::gateway_key): a client certificate's subject and CN (read as a gRPC peer's
// certificate is), and the HTTP peer's address (ClientIdentity). Without the key those entries
// are ignored, so no remote caller can claim an identity by sending them.
//
// Tokens are compared through their SHA-256 (a lookup that leaks nothing of a token's bytes) and
// never logged.
//
// Thread-safety: Authenticate may be called from any thread.
#ifndef OOMB_SERVER_AUTH_H_
#define OOMB_SERVER_AUTH_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/server_context.h"
#include "server/watched_file.h"

namespace oomb::server {

inline constexpr char kAdminGroup[] = "oomb:admins";

// The gateway's metadata (see above).
inline constexpr char kGatewayKeyMetadata[] = "x-oomb-gateway-key";
inline constexpr char kGatewayPeerMetadata[] = "x-oomb-gateway-peer";
inline constexpr char kGatewaySubjectMetadata[] = "x-oomb-gateway-subject";
inline constexpr char kGatewayCommonNameMetadata[] = "x-oomb-gateway-cn";

struct Caller {
  std::string user;  // empty without identities
  std::string uid;
  std::vector<std::string> groups;
  std::string authenticated_by = "none";  // "token", "certificate", "unix-socket" or "none"

  bool admin() const;
  // Whether the caller may act in `project` (a project id, not a name).
  bool MayActIn(const std::string& project) const;
  // The projects its groups name, sorted; an administrator may also act in any other.
  std::vector<std::string> Projects() const;
  // For logs and events: the user, or "anonymous".
  std::string Name() const { return user.empty() ? "anonymous" : user; }
};

// The project a request's `parent` names ("projects/{project}"), or the caller's only one when
// empty (kDefaultProject for an administrator); PERMISSION_DENIED for one it may not act in,
// INVALID_ARGUMENT listing its projects when it has several.
absl::StatusOr<std::string> ProjectOfParent(const Caller& caller, const std::string& parent);

// Logs a denied call (`what` the caller was refused) at most once a second, with how many were
// not; never a token.
void LogDenied(const Caller& caller, absl::string_view what);

struct AuthOptions {
  std::string token;                 // auth.token or the contents of auth.token_file; empty: none
  std::string tokens_file;           // auth.tokens_file; empty: none
  bool client_certificates = false;  // tls.client_ca_file is set: mTLS identities
  std::string gateway_key;           // the HTTP gateway's secret; empty: no gateway
};

class Authenticator {
 public:
  // INVALID_ARGUMENT naming auth.tokens_file when it cannot be read or parsed at start.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(AuthOptions options);

  // The caller of `ctx`; UNAUTHENTICATED (missing or unknown token, no identity) otherwise.
  absl::StatusOr<Caller> Authenticate(const grpc::ServerContextBase& ctx) const;
  // Who is calling, for Job.creator when no user is identified: PeerIdentity, or for the
  // gateway's calls their HTTP peer ("cert:<CN>" with a client certificate).
  std::string ClientIdentity(const grpc::ServerContextBase& ctx) const;
  // Whether any identity is configured (false: every caller is an anonymous administrator).
  bool identifies() const;

 private:
  explicit Authenticator(AuthOptions options) : options_(std::move(options)), tokens_file_(options_.tokens_file) {}
  // The identity of a bearer token's SHA-256, reloading the tokens file when it changed.
  absl::StatusOr<Caller> FromToken(const std::string& token) const;
  // Whether `ctx` carries the gateway's key (constant-time comparison of digests).
  bool FromGateway(const grpc::ServerContextBase& ctx) const;
  // Re-reads the tokens file when it changed (WatchedFile); on an error the identities stay.
  absl::Status Reload() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AuthOptions options_;
  mutable absl::Mutex mu_;
  mutable WatchedFile tokens_file_ ABSL_GUARDED_BY(mu_);
  mutable std::map<std::string, Caller> by_digest_ ABSL_GUARDED_BY(mu_);  // SHA-256 of the token -> caller
};

// Who is calling as gRPC tells it: "cert:<identity>" for an authenticated mTLS peer, else the
// peer's address without its port ("ipv4:127.0.0.1"), or "unix" for the Unix socket.
std::string PeerIdentity(const grpc::ServerContextBase& ctx);

// Parses a Kubernetes static token file; INVALID_ARGUMENT naming `source`:line otherwise. Keys
// are the tokens (not digests), for tests.
absl::StatusOr<std::map<std::string, Caller>> ParseTokensFile(const std::string& text, const std::string& source);

}  // namespace oomb::server

#endif  // OOMB_SERVER_AUTH_H_
