#include "server/daemon.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <iostream>
#include <thread>

#include <spdlog/spdlog.h>

#ifdef OOMB_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/util/time_util.h"
#include "server/notify/webhooks.h"
#include "server/to_proto.h"
#include "worker/common/status.h"
#include "worker/hf/model_config.h"
#include "worker/plan/context_window.h"

namespace oomb::server {
namespace {

// sd_notify(3): > 0 when sent, 0 when NOTIFY_SOCKET is unset (or built without libsystemd).
int Notify(const std::string& state) {
#ifdef OOMB_HAVE_SYSTEMD
  return sd_notify(0, state.c_str());
#else
  (void)state;
  return 0;
#endif
}

// The unit's WatchdogSec= (WATCHDOG_USEC for this process); zero when none.
absl::Duration WatchdogInterval() {
#ifdef OOMB_HAVE_SYSTEMD
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0) return absl::Microseconds(static_cast<int64_t>(usec));
#endif
  return absl::ZeroDuration();
}

// "jobs 2 running, 1 queued" from the store's counts ("no jobs" when empty).
std::string JobCounts(JobStore* store) {
  absl::StatusOr<std::map<v1::Job::State, int64_t>> counts = store->CountByState();
  if (!counts.ok()) return absl::StrCat("job store: ", counts.status().message());
  std::vector<std::string> parts;
  for (const auto& [state, n] : *counts) {
    parts.push_back(absl::StrCat(n, " ", absl::AsciiStrToLower(v1::Job::State_Name(state))));
  }
  return parts.empty() ? "no jobs" : absl::StrCat("jobs ", absl::StrJoin(parts, ", "));
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const char* field) {
  absl::StatusOr<std::string> text = FileAccess::Unconfined()->ReadFile(path, 1 << 20);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat(field, ": ", text.status().message()));
  const std::string secret(absl::StripAsciiWhitespace(*text));
  if (secret.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": the file is empty"));
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & S_IROTH) != 0) {
    spdlog::warn(
        "{}: {} is readable by every user (mode {:04o}); make it readable by the daemon's user only "
        "(chmod 600)",
        field, path, st.st_mode & 07777);
  }
  return secret;
}

// The address a listener bound: `listen`'s host (every address for a bare port) and `port`.
std::string BoundAddress(const std::string& listen, int port) {
  const size_t colon = listen.rfind(':');
  return absl::StrCat(colon == std::string::npos ? "0.0.0.0" : listen.substr(0, colon), ":", port);
}

// This daemon's id in a fleet: server.daemon_id, else host:pid.
std::string DaemonId(const ServerConfig& config) {
  if (!config.daemon_id.empty()) return config.daemon_id;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof host, "localhost");
  return absl::StrCat(host, ":", ::getpid());
}

}  // namespace

// systemd's side of the daemon's life (Type=notify): READY=1 once it serves, STOPPING=1 when the
// drain begins, and in between a thread that refreshes STATUS= every few seconds and, under
// WatchdogSec=, sends WATCHDOG=1 at half that interval. The ping follows a query of the job
// store (the status line's job counts), so a daemon whose store hangs is restarted.
class SystemdNotifier {
 public:
  explicit SystemdNotifier(std::function<std::string()> status) : status_(std::move(status)) {}
  ~SystemdNotifier() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }
  SystemdNotifier(const SystemdNotifier&) = delete;
  SystemdNotifier& operator=(const SystemdNotifier&) = delete;

  // READY=1 with the current status; starts the thread when a notify socket took the message.
  void Ready() {
    if (Notify("READY=1\nSTATUS=" + status_()) <= 0) return;
    const absl::Duration watchdog = WatchdogInterval();
    const absl::Duration period =
        watchdog > absl::ZeroDuration() ? std::min(watchdog / 2, kStatusPeriod) : kStatusPeriod;
    thread_ = std::thread([this, period, ping = watchdog > absl::ZeroDuration()] {
      for (;;) {
        {
          absl::MutexLock lock(&mu_);
          if (mu_.AwaitWithTimeout(absl::Condition(&stop_), period)) return;
        }
        Notify(absl::StrCat(ping ? "WATCHDOG=1\n" : "", "STATUS=", status_()));
      }
    });
  }
  void Stopping() { Notify("STOPPING=1\nSTATUS=" + status_()); }

 private:
  static constexpr absl::Duration kStatusPeriod = absl::Seconds(5);
  const std::function<std::string()> status_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

Daemon::Daemon(const ServerConfig& config, const ServeEnvironment& env) : config_(config), env_(env) {}

Daemon::~Daemon() {
  if (!shut_down_) Shutdown(absl::Now());
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const ServerConfig& config, const ServeEnvironment& env) {
  std::unique_ptr<Daemon> d(new Daemon(config, env));
  OOMB_RETURN_IF_ERROR(d->OpenDataDir());
  OOMB_RETURN_IF_ERROR(d->OpenStore());
  OOMB_RETURN_IF_ERROR(d->StartMetrics());
  OOMB_RETURN_IF_ERROR(d->StartScheduler());
  d->StartWebhooks();
  OOMB_RETURN_IF_ERROR(d->StartServers());
  OOMB_RETURN_IF_ERROR(d->Announce());
  d->SetServing(true);
  d->systemd_ = std::make_unique<SystemdNotifier>([raw = d.get()] { return raw->Status(); });
  d->systemd_->Ready();
  return d;
}

absl::Status Daemon::OpenDataDir() {
  OOMB_ASSIGN_OR_RETURN(data_dir_, FileAccess::Unconfined()->MakeDirs(config_.data_dir, 0700));
  // The job store, checkpoints and the socket live here: only this user may enter, also when
  // the directory existed before with a wider mode.
  if (struct stat st; ::stat(config_.data_dir.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    if (::chmod(config_.data_dir.c_str(), 0700) != 0) return ErrnoStatus(errno, "chmod 0700", config_.data_dir);
    spdlog::warn("data dir {} was mode {:o}; now 0700", config_.data_dir, st.st_mode & 0777);
  }
  // One daemon per data dir: a second one would recover and run the first one's jobs.
  OOMB_ASSIGN_OR_RETURN(lock_, DataDirLock::Acquire(config_.data_dir));
  OOMB_ASSIGN_OR_RETURN(projects_, ProjectRegistry::Create(config_.projects_file));
  OOMB_ASSIGN_OR_RETURN(const DestinationPolicy outbound, OutboundPolicy(config_));
  destinations_ = [outbound, projects = projects_](const std::string& project) {
    return outbound.With(projects->Get(project).outbound);
  };
  OOMB_ASSIGN_OR_RETURN(JobFiles job_files,
                        JobFiles::Create(config_.allowed_roots, config_.data_dir, projects_, config_.datasets_dir));
  files_ = std::make_shared<const JobFiles>(std::move(job_files));
  spdlog::info("job paths confined to {} (never the data dir {})", absl::StrJoin(files_->roots(), ", "),
               config_.data_dir);
  AuthOptions auth;
  auth.token = config_.auth_token;
  if (!config_.auth_token_file.empty()) {
    OOMB_ASSIGN_OR_RETURN(auth.token, ReadSecretFile(config_.auth_token_file, "auth.token_file"));
  }
  auth.tokens_file = config_.auth_tokens_file;
  auth.client_certificates = !config_.tls_client_ca_file.empty();
  if (!config_.http_listen.empty()) {
    unsigned char key[32];
    if (RAND_bytes(key, sizeof key) != 1) return absl::InternalError("cannot draw the HTTP gateway's key");
    gateway_key_ = absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(key), sizeof key));
    auth.gateway_key = gateway_key_;
  }
  OOMB_ASSIGN_OR_RETURN(auth_, Authenticator::Create(std::move(auth)));
  return absl::OkStatus();
}

absl::Status Daemon::OpenStore() {
  if (config_.store_backend != "postgres") {
    OOMB_ASSIGN_OR_RETURN(store_, OpenSqliteJobStore(config_.data_dir + "/oombd.db"));
    store_->SetOutboxPolicy(WebhookOutboxPolicy(projects_, config_.job_webhooks));
    return absl::OkStatus();
  }
  std::string url = config_.postgres_url;
  if (!config_.postgres_url_file.empty()) {
    OOMB_ASSIGN_OR_RETURN(url, ReadSecretFile(config_.postgres_url_file, "store.postgres_url_file"));
  }
  OOMB_ASSIGN_OR_RETURN(store_, OpenPostgresJobStore(url));
  store_->SetOutboxPolicy(WebhookOutboxPolicy(projects_, config_.job_webhooks));
  spdlog::info("fleet mode: PostgreSQL job store; daemon id {}, lease {} s, heartbeat {} s", DaemonId(config_),
               config_.lease_seconds, config_.heartbeat_seconds);
  return absl::OkStatus();
}

// /metrics before the scheduler, so the recovery's state changes are counted.
absl::Status Daemon::StartMetrics() {
  if (config_.metrics_listen.empty()) return absl::OkStatus();
  MetricsExporterOptions o;
  o.listen = config_.metrics_listen;
  o.slots = config_.devices == "auto" ? env_.devices : std::vector<std::string>();
  if (config_.devices != "auto") {
    for (absl::string_view d : absl::StrSplit(config_.devices, ',', absl::SkipWhitespace())) {
      o.slots.emplace_back(absl::StripAsciiWhitespace(d));
    }
  }
  o.build = env_.build;
  o.kv_stats = &kv_stats_;
  o.count_jobs = [store = store_.get()] { return store->CountByState(); };
  o.pending_webhooks = [store = store_.get()] { return store->PendingWebhooks(); };
  o.projects = [store = store_.get(), projects = projects_]() -> absl::StatusOr<std::vector<ProjectSample>> {
    const std::map<std::string, ProjectSettings> listed = projects->All();
    std::vector<ProjectSample> out;
    if (listed.empty()) return out;
    OOMB_ASSIGN_OR_RETURN(const auto usage, store->Usage());
    for (const auto& [project, settings] : listed) {
      const auto it = usage.find(project);
      out.push_back(ProjectSample{project, it == usage.end() ? ProjectUsage() : it->second, settings});
    }
    return out;
  };
  o.device_memory = env_.device_memory;
  o.pinned_host_bytes = env_.pinned_host_bytes;
  OOMB_ASSIGN_OR_RETURN(metrics_, MetricsExporter::Start(std::move(o)));
  return absl::OkStatus();
}

absl::Status Daemon::StartScheduler() {
  SchedulerOptions o;
  o.files = files_;
  if (config_.devices == "auto") {
    o.devices = env_.devices;
  } else {
    for (absl::string_view d : absl::StrSplit(config_.devices, ',', absl::SkipWhitespace())) {
      o.devices.emplace_back(absl::StripAsciiWhitespace(d));
    }
  }
  o.runner = env_.runner;
  if (env_.validate_data) {
    o.validator = [validate = env_.validate_data](const JobConfig& job,
                                                  const FileAccess& access) -> absl::StatusOr<v1::DatasetSummary> {
      OOMB_ASSIGN_OR_RETURN(DataSummary summary, validate(job, access));
      return DatasetSummaryToProto(summary);
    };
  }
  o.context_warnings = [files = files_](const JobConfig& job, int64_t longest) -> std::vector<std::string> {
    absl::StatusOr<Dir> model_dir = files->inputs()->OpenDir(job.model.path);
    absl::StatusOr<ModelConfig> model = model_dir.ok() ? LoadModelConfig(*model_dir) : model_dir.status();
    return model.ok() ? ContextWindowWarnings(*model, job, longest) : std::vector<std::string>();
  };
  o.hold = config_.hold;
  o.max_queued_per_client = config_.max_queued_jobs_per_client;
  o.projects = projects_;
  o.preemption = config_.preemption == "none"  ? PreemptionScope::kNone
                 : config_.preemption == "all" ? PreemptionScope::kAll
                                               : PreemptionScope::kProject;
  o.preemption_min_run = absl::Seconds(config_.preemption_min_run_seconds);
  o.daemon_id = DaemonId(config_);
  o.lease = absl::Seconds(config_.lease_seconds);
  o.heartbeat = absl::Seconds(config_.heartbeat_seconds);
  o.shared_store = config_.store_backend == "postgres";
  MlflowTrackerOptions tracking{
      .default_uri = config_.mlflow_uri,
      .ca_file = config_.webhooks_ca_file,
      .version = env_.server_info.version(),
      .destinations = destinations_,
      .secret = [projects = projects_](const std::string& project,
                                       const std::string& name) -> absl::StatusOr<std::string> {
        const ProjectSettings settings = projects->Get(project);
        const auto it = settings.secrets.find(name);
        if (it == settings.secrets.end()) {
          return absl::InvalidArgumentError(absl::StrCat("tracking.mlflow.token_secret: project ", project,
                                                         " has no secret '", name,
                                                         "' any more (secrets in tenancy.projects_file)"));
        }
        return ReadSecretFile(it->second, "tracking.mlflow.token_secret");
      }};
  if (!config_.mlflow_token_file.empty()) {
    OOMB_ASSIGN_OR_RETURN(tracking.token, ReadSecretFile(config_.mlflow_token_file, "tracking.mlflow_token_file"));
  }
  tracker_ = std::make_unique<MlflowTracker>(store_.get(), std::move(tracking));
  tracker_->Start();
  std::vector<MetricsSink*> sinks = {tracker_.get()};
  if (metrics_ != nullptr) {
    sinks.push_back(metrics_.get());
    o.kv_stats = &kv_stats_;
  }
  sinks_ = std::make_unique<MetricsFanOut>(std::move(sinks));
  o.metrics = sinks_.get();
  scheduler_ = std::make_unique<Scheduler>(store_.get(), &hub_, std::move(o));
  return scheduler_->Start();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Daemon::TcpCredentials() const {
  if (config_.tls_cert_file.empty()) return grpc::InsecureServerCredentials();
  const auto read = [](const std::string& path, const char* field) -> absl::StatusOr<std::string> {
    absl::StatusOr<std::string> text = FileAccess::Unconfined()->ReadFile(path, 1 << 20);
    if (!text.ok()) return Annotate(text.status(), field);
    return text;
  };
  grpc::SslServerCredentialsOptions ssl;
  OOMB_ASSIGN_OR_RETURN(const std::string cert, read(config_.tls_cert_file, "tls.cert_file"));
  OOMB_ASSIGN_OR_RETURN(const std::string key, read(config_.tls_key_file, "tls.key_file"));
  ssl.pem_key_cert_pairs.push_back({key, cert});
  if (!config_.tls_client_ca_file.empty()) {
    OOMB_ASSIGN_OR_RETURN(ssl.pem_root_certs, read(config_.tls_client_ca_file, "tls.client_ca_file"));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

void Daemon::StartWebhooks() {
  WebhookSenderOptions o;
  o.retry_initial = absl::Seconds(config_.webhook_retry_initial_seconds);
  o.retry_max = absl::Seconds(config_.webhook_retry_max_seconds);
  o.give_up_after = absl::Hours(config_.webhook_give_up_hours);
  o.ca_file = config_.webhooks_ca_file;
  o.destinations = destinations_;
  o.max_concurrent = static_cast<int>(config_.webhook_max_concurrent);
  o.per_endpoint = static_cast<int>(config_.webhook_per_endpoint);
  o.user_agent = absl::StrCat("oombd/", env_.server_info.version());
  if (metrics_ != nullptr)
    o.on_attempt = [m = metrics_.get()](const std::string& result) { m->WebhookAttempt(result); };
  webhooks_ = std::make_unique<WebhookSender>(store_.get(), files_.get(), std::move(o));
  webhooks_->Start();
}

absl::Status Daemon::StartServers() {
  create_pool_ = std::make_unique<WorkPool>(/*threads=*/2, /*max_queued=*/64);
  OOMB_ASSIGN_OR_RETURN(authorizer_, Authorizer::Create(auth_.get(), store_.get(), Authorizer::ApiServices()));
  JobServiceOptions jopts;
  jopts.authorizer = authorizer_.get();
  jopts.files = files_;
  jopts.work = create_pool_.get();
  jopts.auth = auth_.get();
  jopts.projects = projects_;
  jopts.validate_data = env_.validate_data;
  jopts.validate_data_max_bytes = config_.validate_inline_max_bytes;
  jopts.job_webhooks = config_.job_webhooks;
  jopts.destinations = destinations_;
  jopts.mlflow_uri = config_.mlflow_uri;
  if (env_.measure_rates) {
    rates_ = std::make_unique<EngineRatesStore>(*data_dir_, env_.measure_rates, env_.rates_key);
    jopts.rates = rates_.get();
  }
  jopts.server_info = env_.server_info;
  *jopts.server_info.mutable_start_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
  service_ = std::make_unique<JobServiceImpl>(store_.get(), scheduler_.get(), &hub_, jopts);
  datasets_ = std::make_unique<DatasetServiceImpl>(
      store_.get(),
      DatasetServiceOptions{.authorizer = authorizer_.get(),
                            .auth = auth_.get(),
                            .projects = projects_,
                            .files = files_,
                            .work = create_pool_.get(),
                            .max_concurrent_uploads = config_.max_concurrent_uploads,
                            .max_concurrent_uploads_per_project = config_.max_concurrent_uploads_per_project,
                            .max_line_bytes = static_cast<size_t>(config_.upload_max_line_bytes)});
  datasets_->RemovePartialUploads();
  if (config_.retention_days > 0) {
    retention_ = std::make_unique<RetentionSweeper>(store_.get(), files_, absl::Hours(24 * config_.retention_days));
  }

  grpc::EnableDefaultHealthCheckService(true);
  if (config_.reflection && !auth_->identifies()) grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // A port another process holds is an error, never shared (SO_REUSEPORT would split clients).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  OOMB_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> tcp, TcpCredentials());
  if (!config_.listen.empty()) builder.AddListeningPort(config_.listen, tcp, &port_);
  if (config_.unix_socket) {
    ::unlink(config_.unix_socket_path.c_str());  // a stale socket from a crash (the data dir is ours)
    owned_paths_.push_back(config_.unix_socket_path);
    builder.AddListeningPort("unix:" + config_.unix_socket_path, grpc::InsecureServerCredentials());
  }
  // Hours-long WatchJob streams: ping idle connections so load balancers keep them, and accept
  // clients' pings at that rate.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(config_.keepalive_seconds * 1000));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.RegisterService(service_.get());
  builder.RegisterService(datasets_.get());
  if (metrics_ != nullptr) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
    interceptors.push_back(metrics_->NewInterceptorFactory());
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  const mode_t old_umask = ::umask(0177);  // the Unix socket is created 0600
  server_ = builder.BuildAndStart();
  ::umask(old_umask);
  if (server_ == nullptr || (!config_.listen.empty() && port_ == 0)) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", config_.listen.empty() ? "" : config_.listen,
                                               config_.unix_socket ? " " + config_.unix_socket_path : ""));
  }
  if (config_.unix_socket) ::chmod(config_.unix_socket_path.c_str(), 0600);
  OOMB_RETURN_IF_ERROR(StartHttpGateway());
  return StartHealthServer();
}

absl::Status Daemon::StartHttpGateway() {
  if (config_.http_listen.empty()) return absl::OkStatus();
  HttpGatewayOptions o;
  HttpServerOptions& s = o.server;
  s.listen = config_.http_listen;
  s.cert_file = config_.tls_cert_file;
  s.key_file = config_.tls_key_file;
  s.client_ca_file = config_.tls_client_ca_file;
  s.max_connections = static_cast<int>(config_.http_max_connections);
  s.max_connections_per_client = static_cast<int>(config_.http_max_connections_per_client);
  s.header_timeout = std::chrono::seconds(config_.http_header_timeout_seconds);
  s.body_timeout = std::chrono::seconds(config_.http_body_timeout_seconds);
  s.idle_timeout = std::chrono::seconds(config_.http_idle_timeout_seconds);
  o.max_streams_per_project = static_cast<int>(config_.http_max_streams_per_project);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  o.channel = server_->InProcessChannel(args);
  o.gateway_key = gateway_key_;
  OOMB_ASSIGN_OR_RETURN(http_, HttpGateway::Start(std::move(o)));
  return absl::OkStatus();
}

// The plaintext health port (docs/CONVENTIONS.md §2): a server of its own whose only service is the
// default grpc.health.v1 one (every server built while EnableDefaultHealthCheckService is on has
// it), so no job method is reachable there without TLS or a token.
absl::Status Daemon::StartHealthServer() {
  if (config_.health_listen.empty()) return absl::OkStatus();
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(config_.health_listen, grpc::InsecureServerCredentials(), &health_port_);
  health_server_ = builder.BuildAndStart();
  if (health_server_ == nullptr || health_port_ == 0) {
    return absl::UnavailableError(absl::StrCat("server.health_listen: cannot listen on ", config_.health_listen));
  }
  return absl::OkStatus();
}

absl::Status Daemon::WritePortFile(const std::string& name, int port) {
  OOMB_RETURN_IF_ERROR(data_dir_->WriteFileAtomic(name, absl::StrCat(port, "\n")));
  owned_paths_.push_back(data_dir_->PathOf(name));
  return absl::OkStatus();
}

absl::Status Daemon::Announce() {
  if (metrics_ != nullptr) {
    const std::string address = BoundAddress(config_.metrics_listen, metrics_->port());
    std::cerr << "oombd: metrics on http://" << address << "/metrics" << std::endl;
    OOMB_RETURN_IF_ERROR(WritePortFile("oombd.metrics.port", metrics_->port()));
  }
  if (http_ != nullptr) {
    const std::string address = BoundAddress(config_.http_listen, http_->port());
    std::cerr << "oombd: HTTP/JSON on " << (config_.tls_cert_file.empty() ? "http://" : "https://") << address << "/v1"
              << std::endl;
    OOMB_RETURN_IF_ERROR(WritePortFile("oombd.http.port", http_->port()));
  }
  if (health_server_ != nullptr) {
    std::cerr << "oombd: health (plaintext grpc.health.v1) on " << BoundAddress(config_.health_listen, health_port_)
              << std::endl;
    OOMB_RETURN_IF_ERROR(WritePortFile("oombd.health.port", health_port_));
  }
  if (!config_.listen.empty()) {
    const std::string host = config_.listen.substr(0, config_.listen.rfind(':'));
    std::cerr << "oombd: listening on " << host << ":" << port_ << std::endl;
    addresses_.push_back(BoundAddress(config_.listen, port_));
  }
  if (config_.unix_socket) {
    std::cerr << "oombd: listening on unix:" << config_.unix_socket_path << std::endl;
    addresses_.push_back("unix:" + config_.unix_socket_path);
  }
  if (health_server_ != nullptr) addresses_.push_back("health " + BoundAddress(config_.health_listen, health_port_));
  if (metrics_ != nullptr) addresses_.push_back("metrics " + BoundAddress(config_.metrics_listen, metrics_->port()));
  if (http_ != nullptr) addresses_.push_back("http " + BoundAddress(config_.http_listen, http_->port()));
  // Last: whoever waits for it finds the other port files already there.
  if (!config_.listen.empty()) {
    OOMB_RETURN_IF_ERROR(WritePortFile("oombd.port", port_));
  }
  return absl::OkStatus();
}

void Daemon::SetServing(bool serving) {
  if (server_ != nullptr) server_->GetHealthCheckService()->SetServingStatus(serving);
  if (health_server_ != nullptr) health_server_->GetHealthCheckService()->SetServingStatus(serving);
}

std::string Daemon::Status() const {
  const std::string jobs = JobCounts(store_.get());
  if (!draining_.load()) return absl::StrCat("serving on ", absl::StrJoin(addresses_, ", "), "; ", jobs);
  return absl::StrCat("draining: running jobs checkpoint (at most ", config_.shutdown_grace_seconds, " s); ", jobs);
}

bool Daemon::Shutdown(absl::Time deadline) {
  shut_down_ = true;
  draining_.store(true);
  SetServing(false);
  if (systemd_ != nullptr) systemd_->Stopping();
  bool checkpointed = true;
  if (scheduler_ != nullptr) {
    checkpointed = scheduler_->Drain(deadline - absl::Now());
    if (!checkpointed) spdlog::warn("jobs stopped without a checkpoint of their own; they resume from their last one");
  }
  hub_.Shutdown();
  if (webhooks_ != nullptr) webhooks_->Stop();
  if (tracker_ != nullptr) tracker_->Stop();  // after the drain: the runs' last steps and ends
  if (http_ != nullptr) http_->Stop();        // its streams end with the gRPC streams they relay
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (health_server_ != nullptr) {  // last: probes see NOT_SERVING until the main server is down
    health_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  systemd_.reset();
  retention_.reset();
  create_pool_.reset();  // joins its threads: every CreateJob and upload check has answered
  for (const std::string& path : owned_paths_) ::unlink(path.c_str());
  return checkpointed;
}

}  // namespace oomb::server
