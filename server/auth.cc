#include "server/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include <spdlog/spdlog.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "grpc/grpc_security_constants.h"
#include "proto/spec/resource_names.h"
#include "server/store/job_store.h"
#include "worker/common/file_access.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

std::string Sha256(const std::string& s) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof digest);
}

// One CSV record (RFC 4180: fields in double quotes may hold commas, "" is a quote); false when
// a quote is left open.
bool SplitCsv(absl::string_view line, std::vector<std::string>* fields) {
  fields->assign(1, "");
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        fields->back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        fields->back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields->emplace_back();
    } else {
      fields->back() += c;
    }
  }
  return !quoted;
}

// The values of the O entries of an RFC 2253 subject ("CN=alice,O=nlp,O=oomb:admins"); commas
// escaped with a backslash stay in their value.
std::vector<std::string> Organizations(const std::string& subject) {
  std::vector<std::string> out;
  std::string entry;
  const auto flush = [&] {
    const absl::string_view e = absl::StripAsciiWhitespace(entry);
    if (absl::StartsWith(e, "O=")) out.emplace_back(e.substr(2));
    entry.clear();
  };
  for (size_t i = 0; i < subject.size(); ++i) {
    if (subject[i] == '\\' && i + 1 < subject.size()) {
      entry += subject[++i];
    } else if (subject[i] == ',' || subject[i] == '+') {
      flush();
    } else {
      entry += subject[i];
    }
  }
  flush();
  return out;
}

std::string Property(const grpc::AuthContext& auth, const char* name) {
  for (const grpc::string_ref& v : auth.FindPropertyValues(name)) return std::string(v.data(), v.size());
  return "";
}

std::string Metadata(const grpc::ServerContextBase& ctx, const char* key) {
  const auto& md = ctx.client_metadata();
  const auto it = md.find(key);
  return it == md.end() ? "" : std::string(it->second.data(), it->second.size());
}

}  // namespace

bool Caller::admin() const {
  return authenticated_by == "none" || std::find(groups.begin(), groups.end(), kAdminGroup) != groups.end();
}

bool Caller::MayActIn(const std::string& project) const {
  return admin() || std::find(groups.begin(), groups.end(), project) != groups.end();
}

std::vector<std::string> Caller::Projects() const {
  std::vector<std::string> out;
  for (const std::string& g : groups) {
    if (names::ValidId(g)) out.push_back(g);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void LogDenied(const Caller& caller, absl::string_view what) {
  static std::atomic<int64_t> last_second{0};
  static std::atomic<int64_t> suppressed{0};
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  int64_t last = last_second.load();
  if (now == last || !last_second.compare_exchange_strong(last, now)) {
    suppressed.fetch_add(1);
    return;
  }
  const int64_t more = suppressed.exchange(0);
  spdlog::warn("denied: {} ({}): {}{}", caller.Name(), caller.authenticated_by, std::string(what),
               more > 0 ? absl::StrCat(" (and ", more, " more denied calls in the last seconds)") : "");
}

absl::StatusOr<std::string> ProjectOfParent(const Caller& caller, const std::string& parent) {
  if (parent.empty()) {
    if (caller.admin()) return std::string(kDefaultProject);
    const std::vector<std::string> projects = caller.Projects();
    if (projects.size() == 1) return projects.front();
    if (projects.empty()) {
      LogDenied(caller, "a request without a project");
      return absl::PermissionDeniedError(absl::StrCat(caller.Name(), " may act in no project (its groups name none)"));
    }
    return absl::InvalidArgumentError(absl::StrCat("parent: ", caller.Name(),
                                                   " may act in several projects; name one: projects/",
                                                   absl::StrJoin(projects, ", projects/")));
  }
  OOMB_ASSIGN_OR_RETURN(const std::string project, names::ParseProject(parent, "parent"));
  if (!caller.MayActIn(project)) {
    LogDenied(caller, absl::StrCat("project ", project));
    return absl::PermissionDeniedError(absl::StrCat(caller.Name(), " may not act in project ", project));
  }
  return project;
}

absl::StatusOr<std::map<std::string, Caller>> ParseTokensFile(const std::string& text, const std::string& source) {
  std::map<std::string, Caller> out;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    const auto error = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": ", what));
    };
    std::vector<std::string> f;
    if (!SplitCsv(line, &f)) return error("a quote is not closed");
    if (f.size() < 3 || f.size() > 4)
      return error(absl::StrCat("expected token,user,uid[,\"groups\"], got ", f.size(), " fields"));
    for (std::string& v : f) v = std::string(absl::StripAsciiWhitespace(v));
    if (f[0].empty() || f[1].empty()) return error("the token and the user must not be empty");
    Caller c;
    c.user = f[1];
    c.uid = f[2];
    if (f.size() == 4) {
      for (absl::string_view g : absl::StrSplit(f[3], ',', absl::SkipWhitespace())) {
        c.groups.emplace_back(absl::StripAsciiWhitespace(g));
      }
    }
    c.authenticated_by = "token";
    if (!out.emplace(f[0], std::move(c)).second) return error("a token listed twice");
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(AuthOptions options) {
  std::unique_ptr<Authenticator> a(new Authenticator(std::move(options)));
  if (!a->options_.tokens_file.empty()) {
    absl::MutexLock lock(&a->mu_);
    OOMB_RETURN_IF_ERROR(Annotate(a->Reload(), "auth.tokens_file"));
  }
  return a;
}

bool Authenticator::identifies() const {
  return !options_.token.empty() || !options_.tokens_file.empty() || options_.client_certificates;
}

absl::Status Authenticator::Reload() const {
  OOMB_ASSIGN_OR_RETURN(const std::optional<std::string> text, tokens_file_.ReadIfChanged());
  if (!text.has_value()) return absl::OkStatus();
  OOMB_ASSIGN_OR_RETURN(const auto callers, ParseTokensFile(*text, tokens_file_.path()));
  const bool first = by_digest_.empty();
  by_digest_.clear();
  for (const auto& [token, caller] : callers) by_digest_.emplace(Sha256(token), caller);
  if (!first) spdlog::info("auth.tokens_file: {} re-read: {} identities", tokens_file_.path(), by_digest_.size());
  return absl::OkStatus();
}

absl::StatusOr<Caller> Authenticator::FromToken(const std::string& token) const {
  const std::string digest = Sha256(token);
  if (!options_.token.empty() && Sha256(options_.token) == digest) {
    Caller admin;
    admin.user = "admin";
    admin.groups = {kAdminGroup};
    admin.authenticated_by = "token";
    return admin;
  }
  if (!options_.tokens_file.empty()) {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = Reload(); !s.ok()) {
      spdlog::warn("auth.tokens_file: keeping the identities read before: {}", std::string(s.message()));
    }
    if (auto it = by_digest_.find(digest); it != by_digest_.end()) return it->second;
  }
  return absl::UnauthenticatedError("invalid bearer token");
}

bool Authenticator::FromGateway(const grpc::ServerContextBase& ctx) const {
  if (options_.gateway_key.empty()) return false;
  const std::string sent = Metadata(ctx, kGatewayKeyMetadata);
  return !sent.empty() && CRYPTO_memcmp(Sha256(sent).data(), Sha256(options_.gateway_key).data(), 32) == 0;
}

std::string Authenticator::ClientIdentity(const grpc::ServerContextBase& ctx) const {
  if (FromGateway(ctx)) {
    const std::string cn = Metadata(ctx, kGatewayCommonNameMetadata);
    if (!cn.empty()) return "cert:" + cn;
    return Metadata(ctx, kGatewayPeerMetadata);
  }
  return PeerIdentity(ctx);
}

std::string PeerIdentity(const grpc::ServerContextBase& ctx) {
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& id : auth->GetPeerIdentity()) return "cert:" + std::string(id.data(), id.size());
  }
  const std::string peer = ctx.peer();  // "ipv4:127.0.0.1:41234", "ipv6:[::1]:41234", "unix:..."
  if (absl::StartsWith(peer, "unix:")) return "unix";
  const size_t colon = peer.rfind(':');
  return colon != std::string::npos && colon > peer.find(':') ? peer.substr(0, colon) : peer;
}

absl::StatusOr<Caller> Authenticator::Authenticate(const grpc::ServerContextBase& ctx) const {
  if (!identifies()) return Caller();
  const auto& md = ctx.client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    const absl::string_view value(it->second.data(), it->second.size());
    // The scheme is case-insensitive (RFC 9110 §11.1): "bearer <token>" is "Bearer <token>".
    if (!absl::StartsWithIgnoreCase(value, "Bearer ")) {
      return absl::UnauthenticatedError("the authorization metadata must be 'Bearer <token>'");
    }
    return FromToken(std::string(value.substr(7)));
  }
  const bool gateway = FromGateway(ctx);
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (options_.client_certificates && (gateway || (auth != nullptr && auth->IsPeerAuthenticated()))) {
    Caller c;
    c.user = gateway ? Metadata(ctx, kGatewayCommonNameMetadata) : Property(*auth, GRPC_X509_CN_PROPERTY_NAME);
    c.groups = Organizations(gateway ? Metadata(ctx, kGatewaySubjectMetadata)
                                     : Property(*auth, GRPC_X509_SUBJECT_PROPERTY_NAME));
    c.authenticated_by = "certificate";
    if (!c.user.empty()) return c;
  }
  if (options_.token.empty() && options_.tokens_file.empty()) {
    // Identities by certificate only: the Unix socket (mode 0600) is the daemon user's own door.
    if (absl::StartsWith(ctx.peer(), "unix:")) {
      Caller owner;
      owner.user = "unix";
      owner.groups = {kAdminGroup};
      owner.authenticated_by = "unix-socket";
      return owner;
    }
    return absl::UnauthenticatedError("a client certificate with a subject CN is required");
  }
  return absl::UnauthenticatedError("missing bearer token (send the metadata 'authorization: Bearer <token>')");
}

}  // namespace oomb::server
