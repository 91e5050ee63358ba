// oombd's configuration: embedded defaults < YAML file < environment (OOMB_SECTION__KEY) <
// flags (docs/CONVENTIONS.md §4). Unknown keys are errors at every level. Secrets come by file
// path; the inline secrets (auth.token and store.postgres_url, for environments that inject
// secrets as variables) are redacted when printed.
//
//   server:
//     data_dir: ~/.local/share/oomb   # or $OOMB_DATA_HOME; the job store, checkpoints, port file
//     listen: 127.0.0.1:7070          # TCP host:port; port 0 picks one (printed, and written to
//                                     # <data_dir>/oombd.port); "" disables TCP
//     health_listen: ""               # plaintext grpc.health.v1 only (no auth, no TLS), for
//                                     # probes that cannot do TLS (Kubernetes); host:port, port 0
//                                     # picks one (<data_dir>/oombd.health.port). Off by default:
//                                     # `listen` already answers health, and a fixed second port
//                                     # would collide between daemons on one host
//     unix_socket: false              # also listen on a Unix socket (mode 0600)
//     unix_socket_path: ""            # default <data_dir>/oombd.sock
//     reflection: true                # gRPC reflection (off whenever callers are identified)
//     shutdown_grace_seconds: 60      # SIGTERM: time for running jobs to checkpoint
//     keepalive_seconds: 60           # HTTP/2 pings that keep idle WatchJob streams alive
//   auth:
//     token_file: ""                  # bearer token required on every method but health
//     token: ""                       # the token itself (secret; prefer token_file; not both)
//     tokens_file: ""                 # identities: a Kubernetes static token file,
//                                     # token,user,uid,"group1,group2" a line, re-read when it
//                                     # changes; groups name the projects a user may act in,
//                                     # oomb:admins every project (server/auth.h)
//   tenancy:
//     projects_file: ""               # per-project settings (server/projects.h): allowed_roots,
//                                     # quotas, max_concurrent_uploads, secrets; re-read when it
//                                     # changes
//   tls:
//     cert_file: ""                   # server certificate (PEM); with key_file enables TLS on `listen`
//     key_file: ""
//     client_ca_file: ""              # set: mTLS, clients must present a certificate from this CA
//   metrics:
//     listen: 127.0.0.1:7071          # Prometheus /metrics over HTTP (docs/metrics.md), host:port;
//                                     # port 0 picks one (printed, and written to
//                                     # <data_dir>/oombd.metrics.port); "" disables it
//   http:
//     listen: 127.0.0.1:7072          # the API over HTTP/JSON (server/http/gateway.h), host:port,
//                                     # with tls.* as the gRPC port has them; port 0 picks one
//                                     # (<data_dir>/oombd.http.port); "" disables it
//     max_connections: 1024           # open at once, in all (server/http/http_server.h); one more
//                                     # is closed as it is accepted
//     max_connections_per_client: 64  # open at once from one IP address
//     header_timeout_seconds: 10      # a request's headers (TLS handshake included, and the wait
//                                     # for the next request on a kept-alive connection)
//     body_timeout_seconds: 30        # a JSON body (up to 4 MiB); uploads: idle_timeout only
//     idle_timeout_seconds: 60        # no byte in or out (a slow upload, a client not reading)
//     max_streams_per_project: 32     # watches (SSE) and downloads open over HTTP per project;
//                                     # more: 429 RESOURCE_EXHAUSTED; 0: no limit
//   scheduler:
//     devices: auto                   # auto (every CUDA device, else cpu) or a list "cuda:0,cuda:1"
//     hold: false                     # queue jobs but start none
//     max_queued_jobs_per_client: 1000  # VALIDATING/QUEUED/PAUSED jobs one client (Job.creator)
//                                     # may have; more: RESOURCE_EXHAUSTED; 0: no limit
//     validate_inline_max_bytes: 16777216  # datasets up to this size are scanned inside
//                                     # CreateJob (errors returned at once); larger ones in
//                                     # the VALIDATING state
//     preemption: project             # which running jobs a waiting job of higher priority
//                                     # preempts (checkpointed after their step, requeued):
//                                     # none, project (its own project's), all (server/scheduler.h)
//     preemption_min_run_seconds: 300 # a job runs at least this long before it can be preempted
//   store:                          # the job store (docs/fleet.md)
//     backend: sqlite                 # sqlite: <data_dir>/oombd.db, one daemon; postgres: a fleet
//                                     # of daemons sharing one queue
//     postgres_url_file: ""           # file holding the libpq URL, e.g.
//                                     # postgresql://oomb:secret@db:5432/oomb (secret)
//     postgres_url: ""                # the URL itself (secret; prefer postgres_url_file)
//     daemon_id: ""                   # this daemon's id on the jobs it runs (Job.daemon); unique
//                                     # among live daemons; default <hostname>:<pid>. Stable ids
//                                     # let a restarted daemon take its jobs back at once
//     lease_seconds: 30               # a running job's lease; a daemon silent this long loses its
//                                     # jobs to the others (they resume from their checkpoints)
//     heartbeat_seconds: 10           # lease renewal and reaper period; < lease_seconds
//   storage:
//     datasets_dir: ""                # uploaded datasets (DatasetService); default
//                                     # <data_dir>/datasets. In a fleet: storage every daemon
//                                     # shares, as the checkpoints' (docs/fleet.md)
//     retention_days: 0               # remove what a deleted job left in the data dir this many
//                                     # days after its deletion (server/retention.h); 0: keep
//   uploads:                        # DatasetService's UploadDataset (server/dataset_service.h)
//     max_concurrent: 8               # uploads in progress at once, every project together; more:
//                                     # RESOURCE_EXHAUSTED naming this key (retry later)
//     max_concurrent_per_project: 2   # the same per project; a project's max_concurrent_uploads
//                                     # (tenancy.projects_file) overrides it
//     max_line_bytes: 16777216        # the longest line an upload may hold (16 MiB, what every
//                                     # job accepts); a longer one is refused naming its line.
//                                     # Checking a line takes about 5 times its size, so an
//                                     # upload's memory is bounded by this (server/dataset_service.h)
//   paths:
//     allowed_roots: ""               # comma-separated directories a job's model, data and
//                                     # checkpoint paths must lie in, reached without a
//                                     # symbolic link below the root (a link is refused);
//                                     # default: the daemon user's home and /tmp. The data dir
//                                     # is never allowed, whatever the roots say; a job without
//                                     # checkpoint.dir writes to <data_dir>/jobs/<id>/checkpoints
//   notifications:                  # webhooks (server/notify/webhooks.h, docs/API.md, "Being told")
//     job_webhooks: true              # jobs may name endpoints of their own
//                                     # (notifications.webhooks); false: only the projects' (projects_file)
//     ca_file: ""                     # CA bundle (PEM) for https endpoints; default: the system's
//     retry_initial_seconds: 5        # a failed delivery is retried after this, doubling each time
//     retry_max_seconds: 3600         # up to this
//     give_up_hours: 72               # and dropped (logged) this long after its event
//     max_concurrent_deliveries: 16   # attempts at once, every endpoint together
//     max_concurrent_per_endpoint: 2  # attempts at once to one endpoint (scheme, host, port): a
//                                     # hanging receiver holds no more; each endpoint backs off
//                                     # on its own (server/notify/webhook_sender.h)
//   tracking:
//     mlflow_uri: ""                  # MLflow tracking server every job logs to unless its spec names
//                                     # one (spec.tracking.mlflow; server/notify/mlflow_tracker.h)
//     mlflow_token_file: ""           # bearer token for it (secret), sent to mlflow_uri's server
//                                     # only, never to a server a job names (needs mlflow_uri)
//   outbound:                       # where requests on a tenant's behalf may go (the webhooks and
//                                     # MLflow server a job names; server/notify/destination_policy.h):
//                                     # by default public addresses only, never loopback, private,
//                                     # link-local, multicast or metadata ones, checked at submit
//                                     # and at each connection
//     allow: ""                       # comma-separated addresses, CIDRs or host names
//                                     # ("10.20.0.0/16, mlflow.corp, *.hooks.corp") allowed all the
//                                     # same; per project too (tenancy.projects_file, outbound)
//     deny: ""                        # the same, refused although public; the most specific entry
//                                     # decides
//   log:
//     level: info                     # trace | debug | info | warn | error
//     format: text                    # text, or json: one JSON object a line ({time, level,
//                                     # logger, thread, message}) for Loki or ELK; the readiness
//                                     # lines ("oombd: listening on ...") stay as they are
#ifndef OOMB_SERVER_CONFIG_H_
#define OOMB_SERVER_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/notify/destination_policy.h"

namespace oomb::server {

struct ServerConfig {
  std::string data_dir;  // filled from OOMB_DATA_HOME or ~/.local/share/oomb when unset
  std::string listen = "127.0.0.1:7070";
  std::string health_listen;
  bool unix_socket = false;
  std::string unix_socket_path;
  std::string metrics_listen = "127.0.0.1:7071";
  std::string http_listen = "127.0.0.1:7072";
  int64_t http_max_connections = 1024;
  int64_t http_max_connections_per_client = 64;
  int64_t http_header_timeout_seconds = 10;
  int64_t http_body_timeout_seconds = 30;
  int64_t http_idle_timeout_seconds = 60;
  int64_t http_max_streams_per_project = 32;
  bool reflection = true;
  int64_t shutdown_grace_seconds = 60;
  int64_t keepalive_seconds = 60;
  std::string auth_token_file;
  std::string auth_token;  // secret
  std::string auth_tokens_file;
  std::string projects_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  std::string devices = "auto";
  bool hold = false;
  int64_t validate_inline_max_bytes = int64_t{16} << 20;
  int64_t max_queued_jobs_per_client = 1000;
  std::string preemption = "project";
  int64_t preemption_min_run_seconds = 300;
  std::string store_backend = "sqlite";
  std::string postgres_url_file;
  std::string postgres_url;  // secret
  std::string daemon_id;     // empty: <hostname>:<pid>, filled at start
  int64_t lease_seconds = 30;
  int64_t heartbeat_seconds = 10;
  std::string datasets_dir;  // empty: <data_dir>/datasets
  int64_t retention_days = 0;
  int64_t max_concurrent_uploads = 8;
  int64_t max_concurrent_uploads_per_project = 2;
  int64_t upload_max_line_bytes = int64_t{16} << 20;
  std::string allowed_roots;  // filled with "$HOME,/tmp" when unset
  bool job_webhooks = true;
  std::string webhooks_ca_file;
  int64_t webhook_retry_initial_seconds = 5;
  int64_t webhook_retry_max_seconds = 3600;
  int64_t webhook_give_up_hours = 72;
  int64_t webhook_max_concurrent = 16;
  int64_t webhook_per_endpoint = 2;
  std::string mlflow_uri;
  std::string mlflow_token_file;
  std::string outbound_allow;  // comma-separated entries (DestinationPolicy::Parse)
  std::string outbound_deny;
  std::string log_level = "info";
  std::string log_format = "text";
};

struct ConfigSources {
  std::string file;                        // YAML file; empty: none
  std::map<std::string, std::string> env;  // the process environment (only OOMB_*__* is read)
  std::vector<std::string> overrides;      // "section.key=value", applied last (flags)
};

// INVALID_ARGUMENT naming the source and key for unknown keys and bad values, e.g.
// "config.yaml:3: server.lissten: unknown key" or "environment OOMB_SERVER__PORT: unknown key".
absl::StatusOr<ServerConfig> LoadServerConfig(const ConfigSources& sources);

// The effective configuration as YAML, secrets replaced by "<redacted>".
std::string ServerConfigToYaml(const ServerConfig& config);

// The daemon's outbound.allow / outbound.deny as a policy (checked by LoadServerConfig).
absl::StatusOr<DestinationPolicy> OutboundPolicy(const ServerConfig& config);

// The process environment as a map.
std::map<std::string, std::string> ProcessEnvironment();

}  // namespace oomb::server

#endif  // OOMB_SERVER_CONFIG_H_
