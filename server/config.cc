#include "server/config.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <variant>

#include <yaml-cpp/yaml.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "worker/common/file_access.h"
#include "worker/common/status.h"

extern char** environ;

namespace oomb::server {
namespace {

using Member = std::variant<std::string ServerConfig::*, bool ServerConfig::*, int64_t ServerConfig::*>;

struct Key {
  const char* path;  // "section.key"
  Member member;
  bool secret = false;
};

const std::vector<Key>& Keys() {
  static const std::vector<Key>* const kKeys = new std::vector<Key>{
      {"server.data_dir", &ServerConfig::data_dir},
      {"server.listen", &ServerConfig::listen},
      {"server.health_listen", &ServerConfig::health_listen},
      {"server.unix_socket", &ServerConfig::unix_socket},
      {"server.unix_socket_path", &ServerConfig::unix_socket_path},
      {"server.reflection", &ServerConfig::reflection},
      {"server.shutdown_grace_seconds", &ServerConfig::shutdown_grace_seconds},
      {"server.keepalive_seconds", &ServerConfig::keepalive_seconds},
      {"auth.token_file", &ServerConfig::auth_token_file},
      {"auth.token", &ServerConfig::auth_token, true},
      {"auth.tokens_file", &ServerConfig::auth_tokens_file},
      {"tenancy.projects_file", &ServerConfig::projects_file},
      {"tls.cert_file", &ServerConfig::tls_cert_file},
      {"tls.key_file", &ServerConfig::tls_key_file},
      {"tls.client_ca_file", &ServerConfig::tls_client_ca_file},
      {"metrics.listen", &ServerConfig::metrics_listen},
      {"http.listen", &ServerConfig::http_listen},
      {"http.max_connections", &ServerConfig::http_max_connections},
      {"http.max_connections_per_client", &ServerConfig::http_max_connections_per_client},
      {"http.header_timeout_seconds", &ServerConfig::http_header_timeout_seconds},
      {"http.body_timeout_seconds", &ServerConfig::http_body_timeout_seconds},
      {"http.idle_timeout_seconds", &ServerConfig::http_idle_timeout_seconds},
      {"http.max_streams_per_project", &ServerConfig::http_max_streams_per_project},
      {"scheduler.devices", &ServerConfig::devices},
      {"scheduler.hold", &ServerConfig::hold},
      {"scheduler.validate_inline_max_bytes", &ServerConfig::validate_inline_max_bytes},
      {"scheduler.max_queued_jobs_per_client", &ServerConfig::max_queued_jobs_per_client},
      {"scheduler.preemption", &ServerConfig::preemption},
      {"scheduler.preemption_min_run_seconds", &ServerConfig::preemption_min_run_seconds},
      {"store.backend", &ServerConfig::store_backend},
      {"store.postgres_url_file", &ServerConfig::postgres_url_file},
      {"store.postgres_url", &ServerConfig::postgres_url, true},
      {"store.daemon_id", &ServerConfig::daemon_id},
      {"store.lease_seconds", &ServerConfig::lease_seconds},
      {"store.heartbeat_seconds", &ServerConfig::heartbeat_seconds},
      {"storage.datasets_dir", &ServerConfig::datasets_dir},
      {"storage.retention_days", &ServerConfig::retention_days},
      {"uploads.max_concurrent", &ServerConfig::max_concurrent_uploads},
      {"uploads.max_concurrent_per_project", &ServerConfig::max_concurrent_uploads_per_project},
      {"uploads.max_line_bytes", &ServerConfig::upload_max_line_bytes},
      {"paths.allowed_roots", &ServerConfig::allowed_roots},
      {"notifications.job_webhooks", &ServerConfig::job_webhooks},
      {"notifications.ca_file", &ServerConfig::webhooks_ca_file},
      {"notifications.retry_initial_seconds", &ServerConfig::webhook_retry_initial_seconds},
      {"notifications.retry_max_seconds", &ServerConfig::webhook_retry_max_seconds},
      {"notifications.give_up_hours", &ServerConfig::webhook_give_up_hours},
      {"notifications.max_concurrent_deliveries", &ServerConfig::webhook_max_concurrent},
      {"notifications.max_concurrent_per_endpoint", &ServerConfig::webhook_per_endpoint},
      {"tracking.mlflow_uri", &ServerConfig::mlflow_uri},
      {"tracking.mlflow_token_file", &ServerConfig::mlflow_token_file},
      {"outbound.allow", &ServerConfig::outbound_allow},
      {"outbound.deny", &ServerConfig::outbound_deny},
      {"log.level", &ServerConfig::log_level},
      {"log.format", &ServerConfig::log_format},
  };
  return *kKeys;
}

const Key* FindKey(const std::string& path) {
  for (const Key& k : Keys()) {
    if (path == k.path) return &k;
  }
  return nullptr;
}

// Sets `key` from its textual value; `where` prefixes errors.
absl::Status SetValue(const Key& key, const std::string& value, const std::string& where, ServerConfig* config) {
  return std::visit(
      [&](auto member) -> absl::Status {
        using T = std::remove_reference_t<decltype(config->*member)>;
        if constexpr (std::is_same_v<T, std::string>) {
          config->*member = value;
        } else if constexpr (std::is_same_v<T, bool>) {
          const std::string v = absl::AsciiStrToLower(value);
          if (v != "true" && v != "false" && v != "1" && v != "0") {
            return absl::InvalidArgumentError(
                absl::StrCat(where, key.path, ": expected true or false, got '", value, "'"));
          }
          config->*member = v == "true" || v == "1";
        } else {
          int64_t n = 0;
          if (!absl::SimpleAtoi(value, &n) || n < 0) {
            return absl::InvalidArgumentError(
                absl::StrCat(where, key.path, ": expected a non-negative integer, got '", value, "'"));
          }
          config->*member = n;
        }
        return absl::OkStatus();
      },
      key.member);
}

absl::Status UnknownKey(const std::string& where, const std::string& path) {
  std::string known;
  for (const Key& k : Keys()) absl::StrAppend(&known, known.empty() ? "" : ", ", k.path);
  return absl::InvalidArgumentError(absl::StrCat(where, path, ": unknown key (known keys: ", known, ")"));
}

absl::Status LoadFile(const std::string& file, ServerConfig* config) {
  OOMB_ASSIGN_OR_RETURN(std::string text, FileAccess::Unconfined()->ReadFile(file, int64_t{1} << 20));
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(file, ":", e.mark.line + 1, ": YAML syntax error: ", e.msg));
  }
  if (root.IsNull()) return absl::OkStatus();
  if (!root.IsMap()) return absl::InvalidArgumentError(absl::StrCat(file, ": expected a mapping of sections"));
  for (const auto& section : root) {
    const std::string name = section.first.Scalar();
    const std::string where = absl::StrCat(file, ":", section.first.Mark().line + 1, ": ");
    if (!section.second.IsMap()) {
      bool known_section = false;
      for (const Key& k : Keys()) known_section |= absl::StartsWith(k.path, name + ".");
      if (!known_section) return UnknownKey(where, name);
      if (section.second.IsNull()) continue;
      return absl::InvalidArgumentError(absl::StrCat(where, name, ": expected a mapping"));
    }
    for (const auto& kv : section.second) {
      const std::string path = absl::StrCat(name, ".", kv.first.Scalar());
      const std::string kwhere = absl::StrCat(file, ":", kv.first.Mark().line + 1, ": ");
      const Key* key = FindKey(path);
      if (key == nullptr) return UnknownKey(kwhere, path);
      if (!kv.second.IsScalar() && !kv.second.IsNull()) {
        return absl::InvalidArgumentError(absl::StrCat(kwhere, path, ": expected a scalar value"));
      }
      OOMB_RETURN_IF_ERROR(SetValue(*key, kv.second.IsNull() ? "" : kv.second.Scalar(), kwhere, config));
    }
  }
  return absl::OkStatus();
}

// The OOMB_SECTION__KEY variables of `env` (others, such as OOMB_DATA_HOME, are not config keys).
absl::Status ApplyEnvironment(const std::map<std::string, std::string>& env, ServerConfig* config) {
  for (const auto& [name, value] : env) {
    absl::string_view rest = name;
    if (!absl::ConsumePrefix(&rest, "OOMB_")) continue;
    const size_t sep = rest.find("__");
    if (sep == absl::string_view::npos) continue;  // OOMB_DATA_HOME, OOMB_ENDPOINT, ...: not config keys
    const std::string path = absl::AsciiStrToLower(absl::StrCat(rest.substr(0, sep), ".", rest.substr(sep + 2)));
    const std::string where = absl::StrCat("environment ", name, ": ");
    const Key* key = FindKey(path);
    if (key == nullptr) return UnknownKey(where, path);
    OOMB_RETURN_IF_ERROR(SetValue(*key, value, where, config));
  }
  return absl::OkStatus();
}

absl::Status ApplyOverrides(const std::vector<std::string>& overrides, ServerConfig* config) {
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("--set ", o, ": expected section.key=value"));
    }
    const std::string where = absl::StrCat("--set ", o, ": ");
    const Key* key = FindKey(o.substr(0, eq));
    if (key == nullptr) return UnknownKey(where, o.substr(0, eq));
    OOMB_RETURN_IF_ERROR(SetValue(*key, o.substr(eq + 1), where, config));
  }
  return absl::OkStatus();
}

// Paths derived from the environment where the sources left them empty.
void ApplyDefaults(const std::map<std::string, std::string>& env, ServerConfig* config) {
  if (config->data_dir.empty()) {
    auto it = env.find("OOMB_DATA_HOME");
    if (it != env.end() && !it->second.empty()) {
      config->data_dir = it->second;
    } else {
      auto home = env.find("HOME");
      config->data_dir = absl::StrCat(home != env.end() ? home->second : "", "/.local/share/oomb");
    }
  }
  if (config->allowed_roots.empty()) {
    auto home = env.find("HOME");
    config->allowed_roots = home != env.end() && !home->second.empty() ? home->second + ",/tmp" : "/tmp";
  }
  if (config->unix_socket && config->unix_socket_path.empty())
    config->unix_socket_path = config->data_dir + "/oombd.sock";
}

// A listening address: [host]:port with a port of digits in [0, 65535] (0: the system picks one);
// empty (off) where `may_be_empty`.
absl::Status CheckListen(const char* key, const std::string& address, bool may_be_empty) {
  if (address.empty() && may_be_empty) return absl::OkStatus();
  const size_t colon = address.rfind(':');
  const std::string port = colon == std::string::npos ? "" : address.substr(colon + 1);
  int64_t value = -1;
  if (colon == std::string::npos || port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](unsigned char c) { return std::isdigit(c); }) ||
      !absl::SimpleAtoi(port, &value) || value > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": expected host:port with a port in [0, 65535] (0 picks a free one), got '", address, "'"));
  }
  return absl::OkStatus();
}

// What the daemon sends for tenants (issue 78): the destination lists, the deliveries' bounds,
// and the MLflow token's server.
absl::Status CheckOutbound(const ServerConfig& config) {
  if (config.webhook_max_concurrent < 1 || config.webhook_max_concurrent > 256 || config.webhook_per_endpoint < 1 ||
      config.webhook_per_endpoint > config.webhook_max_concurrent) {
    return absl::InvalidArgumentError(absl::StrCat(
        "notifications.max_concurrent_deliveries / max_concurrent_per_endpoint: need 1 <= per endpoint <= all <= 256; "
        "got ",
        config.webhook_max_concurrent, " and ", config.webhook_per_endpoint));
  }
  if (!config.mlflow_token_file.empty() && config.mlflow_uri.empty()) {
    return absl::InvalidArgumentError(
        "tracking.mlflow_token_file: needs tracking.mlflow_uri, the server the token is for (it goes to no other)");
  }
  return OutboundPolicy(config).status();
}

// What one client's uploads may hold (issue 78): how many at once, and the longest line.
absl::Status CheckUploads(const ServerConfig& config) {
  if (config.max_concurrent_uploads < 1 || config.max_concurrent_uploads_per_project < 1 ||
      config.max_concurrent_uploads_per_project > config.max_concurrent_uploads) {
    return absl::InvalidArgumentError(
        absl::StrCat("uploads.max_concurrent / max_concurrent_per_project: need 1 <= per project <= all; got ",
                     config.max_concurrent_uploads, " and ", config.max_concurrent_uploads_per_project));
  }
  constexpr int64_t kMinLine = int64_t{1} << 20, kMaxLine = int64_t{256} << 20;
  if (config.upload_max_line_bytes < kMinLine || config.upload_max_line_bytes > kMaxLine) {
    return absl::InvalidArgumentError(absl::StrCat("uploads.max_line_bytes: must be ", kMinLine, " to ", kMaxLine,
                                                   " (1 MiB to 256 MiB); got ", config.upload_max_line_bytes));
  }
  return absl::OkStatus();
}

// Values each fine alone but wrong together, and ranges.
absl::Status Check(const ServerConfig& config) {
  OOMB_RETURN_IF_ERROR(CheckListen("server.listen", config.listen, true));  // empty: checked below
  OOMB_RETURN_IF_ERROR(CheckListen("server.health_listen", config.health_listen, true));
  OOMB_RETURN_IF_ERROR(CheckListen("metrics.listen", config.metrics_listen, true));
  OOMB_RETURN_IF_ERROR(CheckListen("http.listen", config.http_listen, true));
  if (config.tls_cert_file.empty() != config.tls_key_file.empty()) {
    return absl::InvalidArgumentError("tls.cert_file and tls.key_file: set both or neither");
  }
  if (!config.tls_client_ca_file.empty() && config.tls_cert_file.empty()) {
    return absl::InvalidArgumentError("tls.client_ca_file: needs tls.cert_file and tls.key_file");
  }
  if (config.listen.empty() && !config.unix_socket) {
    return absl::InvalidArgumentError("server.listen: empty and no unix socket: nothing to listen on");
  }
  if (config.max_queued_jobs_per_client < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler.max_queued_jobs_per_client: must be >= 0, got ", config.max_queued_jobs_per_client));
  }
  if (config.preemption != "none" && config.preemption != "project" && config.preemption != "all") {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler.preemption: must be none, project or all; got '", config.preemption, "'"));
  }
  if (!config.auth_token.empty() && !config.auth_token_file.empty()) {
    return absl::InvalidArgumentError("auth.token and auth.token_file: set one, not both");
  }
  if (config.validate_inline_max_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler.validate_inline_max_bytes: must be >= 0, got ", config.validate_inline_max_bytes));
  }
  if (config.store_backend != "sqlite" && config.store_backend != "postgres") {
    return absl::InvalidArgumentError(
        absl::StrCat("store.backend: must be sqlite or postgres; got '", config.store_backend, "'"));
  }
  const bool has_url = !config.postgres_url.empty() || !config.postgres_url_file.empty();
  if (config.store_backend == "postgres" && !has_url) {
    return absl::InvalidArgumentError("store.backend: postgres needs store.postgres_url_file (or store.postgres_url)");
  }
  if (config.store_backend == "sqlite" && has_url) {
    return absl::InvalidArgumentError(
        "store.postgres_url_file / store.postgres_url: set, but store.backend is sqlite (set store.backend: postgres)");
  }
  if (!config.postgres_url.empty() && !config.postgres_url_file.empty()) {
    return absl::InvalidArgumentError("store.postgres_url and store.postgres_url_file: set one, not both");
  }
  if (config.heartbeat_seconds < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("store.heartbeat_seconds: must be >= 1, got ", config.heartbeat_seconds));
  }
  if (config.lease_seconds <= config.heartbeat_seconds) {
    return absl::InvalidArgumentError(absl::StrCat("store.lease_seconds: must be longer than store.heartbeat_seconds (",
                                                   config.heartbeat_seconds, "), got ", config.lease_seconds,
                                                   "; two or three heartbeats per lease ride out a slow one"));
  }
  if (config.log_format != "text" && config.log_format != "json") {
    return absl::InvalidArgumentError(absl::StrCat("log.format: must be text or json; got '", config.log_format, "'"));
  }
  if (config.webhook_retry_initial_seconds < 1 ||
      config.webhook_retry_max_seconds < config.webhook_retry_initial_seconds) {
    return absl::InvalidArgumentError(
        absl::StrCat("notifications.retry_initial_seconds / retry_max_seconds: need 1 <= initial <= max; got ",
                     config.webhook_retry_initial_seconds, " and ", config.webhook_retry_max_seconds));
  }
  OOMB_RETURN_IF_ERROR(CheckOutbound(config));
  OOMB_RETURN_IF_ERROR(CheckUploads(config));
  static const char* const kLevels[] = {"trace", "debug", "info", "warn", "error"};
  if (std::find(std::begin(kLevels), std::end(kLevels), config.log_level) == std::end(kLevels)) {
    return absl::InvalidArgumentError(
        absl::StrCat("log.level: must be trace, debug, info, warn or error; got '", config.log_level, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DestinationPolicy> OutboundPolicy(const ServerConfig& config) {
  const auto list = [](const std::string& text) {
    std::vector<std::string> out;
    for (absl::string_view e : absl::StrSplit(text, ',', absl::SkipWhitespace())) out.emplace_back(e);
    return out;
  };
  return DestinationPolicy::Parse(list(config.outbound_allow), list(config.outbound_deny), "outbound");
}

std::map<std::string, std::string> ProcessEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

absl::StatusOr<ServerConfig> LoadServerConfig(const ConfigSources& sources) {
  ServerConfig config;
  if (!sources.file.empty()) OOMB_RETURN_IF_ERROR(LoadFile(sources.file, &config));
  OOMB_RETURN_IF_ERROR(ApplyEnvironment(sources.env, &config));
  OOMB_RETURN_IF_ERROR(ApplyOverrides(sources.overrides, &config));
  ApplyDefaults(sources.env, &config);
  OOMB_RETURN_IF_ERROR(Check(config));
  return config;
}

std::string ServerConfigToYaml(const ServerConfig& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string section;
  for (const Key& k : Keys()) {
    const std::string path = k.path;
    const std::string sec = path.substr(0, path.find('.'));
    if (sec != section) {
      if (!section.empty()) out << YAML::EndMap;
      out << YAML::Key << sec << YAML::Value << YAML::BeginMap;
      section = sec;
    }
    out << YAML::Key << path.substr(path.find('.') + 1) << YAML::Value;
    std::visit(
        [&](auto member) {
          using T = std::remove_cvref_t<decltype(config.*member)>;
          if constexpr (std::is_same_v<T, std::string>) {
            const std::string& v = config.*member;
            if (k.secret && !v.empty()) {
              out << "<redacted>";
            } else {
              out << YAML::DoubleQuoted << v;
            }
          } else if constexpr (std::is_same_v<T, bool>) {
            out << (config.*member ? "true" : "false");
          } else {
            out << config.*member;
          }
        },
        k.member);
  }
  if (!section.empty()) out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace oomb::server
