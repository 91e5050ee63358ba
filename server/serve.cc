#include "server/serve.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <iostream>
#include <thread>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#ifdef OOMB_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/util/time_util.h"
#include "server/data_dir_lock.h"
#include "server/job_service.h"
#include "server/metrics/exporter.h"
#include "server/store/job_store.h"
#include "server/to_proto.h"
#include "server/watch_hub.h"
#include "server/work_pool.h"
#include "worker/common/file_access.h"
#include "worker/common/status.h"

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

// systemd's side of the daemon's life (Type=notify): READY=1 once it serves, STOPPING=1 when
// the drain begins, and in between a thread that refreshes STATUS= every few seconds and,
// under WatchdogSec=, sends WATCHDOG=1 at half that interval. The ping follows a query of the
// job store (the status line's job counts), so a daemon whose store hangs is restarted.
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
  return std::string(absl::StripAsciiWhitespace(*text));
}

// The address a listener bound: `listen`'s host (every address for a bare port) and `port`.
std::string BoundAddress(const std::string& listen, int port) {
  const size_t colon = listen.rfind(':');
  return absl::StrCat(colon == std::string::npos ? "0.0.0.0" : listen.substr(0, colon), ":", port);
}

int Fail(const absl::Status& s) {
  std::cerr << "oombd: " << s.message() << "\n";
  return 1;
}

}  // namespace

int Serve(const ServerConfig& config, const ServeEnvironment& env) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("oombd"));  // logs on stderr, never stdout
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  // Signals are taken by sigwait() below: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<Dir> data_dir = FileAccess::Unconfined()->MakeDirs(config.data_dir, 0700);
  if (!data_dir.ok()) return Fail(data_dir.status());
  // The job store, checkpoints and the socket live here: only this user may enter, also when
  // the directory existed before with a wider mode.
  if (struct stat st; ::stat(config.data_dir.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    if (::chmod(config.data_dir.c_str(), 0700) != 0) {
      return Fail(ErrnoStatus(errno, "chmod 0700", config.data_dir));
    }
    spdlog::warn("data dir {} was mode {:o}; now 0700", config.data_dir, st.st_mode & 0777);
  }
  // One daemon per data dir: a second one would recover and run the first one's jobs.
  absl::StatusOr<DataDirLock> lock = DataDirLock::Acquire(config.data_dir);
  if (!lock.ok()) return Fail(lock.status());
  absl::StatusOr<JobFiles> job_files = JobFiles::Create(config.allowed_roots, config.data_dir);
  if (!job_files.ok()) return Fail(job_files.status());
  const auto files = std::make_shared<const JobFiles>(*std::move(job_files));
  spdlog::info("job paths confined to {} (never the data dir {})", absl::StrJoin(files->roots(), ", "),
               config.data_dir);
  std::string token = config.auth_token;
  if (!config.auth_token_file.empty()) {
    absl::StatusOr<std::string> t = ReadSecretFile(config.auth_token_file, "auth.token_file");
    if (!t.ok()) return Fail(t.status());
    token = *t;
    if (token.empty()) return Fail(absl::InvalidArgumentError("auth.token_file: the file is empty"));
  }

  const bool fleet = config.store_backend == "postgres";
  absl::StatusOr<std::unique_ptr<JobStore>> store;
  if (fleet) {
    std::string url = config.postgres_url;
    if (!config.postgres_url_file.empty()) {
      absl::StatusOr<std::string> u = ReadSecretFile(config.postgres_url_file, "store.postgres_url_file");
      if (!u.ok()) return Fail(u.status());
      url = *u;
      if (url.empty()) return Fail(absl::InvalidArgumentError("store.postgres_url_file: the file is empty"));
    }
    store = OpenPostgresJobStore(url);
  } else {
    store = OpenSqliteJobStore(config.data_dir + "/oombd.db");
  }
  if (!store.ok()) return Fail(store.status());
  std::string daemon_id = config.daemon_id;
  if (daemon_id.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof host, "localhost");
    daemon_id = absl::StrCat(host, ":", ::getpid());
  }
  if (fleet) {
    spdlog::info("fleet mode: PostgreSQL job store; daemon id {}, lease {} s, heartbeat {} s", daemon_id,
                 config.lease_seconds, config.heartbeat_seconds);
  }

  SchedulerOptions sopts;
  sopts.files = files;
  if (config.devices == "auto") {
    sopts.devices = env.devices;
  } else {
    for (absl::string_view d : absl::StrSplit(config.devices, ',', absl::SkipWhitespace())) {
      sopts.devices.emplace_back(absl::StripAsciiWhitespace(d));
    }
  }
  sopts.runner = env.runner;
  if (env.validate_data) {
    sopts.validator = [validate = env.validate_data](const JobConfig& spec,
                                                     const FileAccess& access) -> absl::StatusOr<v1::DatasetSummary> {
      OOMB_ASSIGN_OR_RETURN(DataSummary summary, validate(spec, access));
      return DatasetSummaryToProto(summary);
    };
  }
  sopts.hold = config.hold;
  sopts.max_queued_per_client = config.max_queued_jobs_per_client;
  sopts.daemon_id = daemon_id;
  sopts.lease = absl::Seconds(config.lease_seconds);
  sopts.heartbeat = absl::Seconds(config.heartbeat_seconds);
  sopts.shared_store = fleet;

  // /metrics first, so the recovery's state changes are counted; it outlives the scheduler
  // and the gRPC server (declared before them).
  KvStatsRegistry kv_stats;
  std::unique_ptr<MetricsExporter> metrics;
  if (!config.metrics_listen.empty()) {
    MetricsExporterOptions mopts;
    mopts.listen = config.metrics_listen;
    mopts.slots = sopts.devices;
    mopts.build = env.build;
    mopts.kv_stats = &kv_stats;
    JobStore* const job_store = store->get();
    mopts.count_jobs = [job_store] { return job_store->CountByState(); };
    mopts.device_memory = env.device_memory;
    mopts.pinned_host_bytes = env.pinned_host_bytes;
    absl::StatusOr<std::unique_ptr<MetricsExporter>> m = MetricsExporter::Start(std::move(mopts));
    if (!m.ok()) return Fail(m.status());
    metrics = *std::move(m);
    sopts.metrics = metrics.get();
    sopts.kv_stats = &kv_stats;
  }
  WatchHub hub;
  Scheduler scheduler(store->get(), &hub, sopts);
  if (absl::Status s = scheduler.Start(); !s.ok()) return Fail(s);

  // CreateJob's checks (dataset scans of up to validate_inline_max_bytes) run here, off gRPC's
  // callback threads; declared before the server, which waits for them when it shuts down.
  WorkPool create_pool(/*threads=*/2, /*max_queued=*/64);
  JobServiceOptions jopts;
  jopts.files = files;
  jopts.work = &create_pool;
  jopts.auth_token = token;
  jopts.validate_data = env.validate_data;
  jopts.validate_data_max_bytes = config.validate_inline_max_bytes;
  jopts.server_info = env.server_info;
  *jopts.server_info.mutable_start_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
  JobServiceImpl service(store->get(), &scheduler, &hub, jopts);

  grpc::EnableDefaultHealthCheckService(true);
  if (config.reflection && token.empty()) grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // A port another process holds is an error, never shared (SO_REUSEPORT would split clients).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::shared_ptr<grpc::ServerCredentials> tcp_creds = grpc::InsecureServerCredentials();
  if (!config.tls_cert_file.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    absl::StatusOr<std::string> cert = FileAccess::Unconfined()->ReadFile(config.tls_cert_file, 1 << 20);
    absl::StatusOr<std::string> key = FileAccess::Unconfined()->ReadFile(config.tls_key_file, 1 << 20);
    if (!cert.ok()) return Fail(Annotate(cert.status(), "tls.cert_file"));
    if (!key.ok()) return Fail(Annotate(key.status(), "tls.key_file"));
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    if (!config.tls_client_ca_file.empty()) {
      absl::StatusOr<std::string> ca = FileAccess::Unconfined()->ReadFile(config.tls_client_ca_file, 1 << 20);
      if (!ca.ok()) return Fail(Annotate(ca.status(), "tls.client_ca_file"));
      ssl.pem_root_certs = *ca;
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    tcp_creds = grpc::SslServerCredentials(ssl);
  }
  int port = 0;
  if (!config.listen.empty()) builder.AddListeningPort(config.listen, tcp_creds, &port);
  if (config.unix_socket) {
    ::unlink(config.unix_socket_path.c_str());  // a stale socket from a crash
    builder.AddListeningPort("unix:" + config.unix_socket_path, grpc::InsecureServerCredentials());
  }
  // Hours-long WatchJob streams: ping idle connections so load balancers keep them, and
  // accept clients' pings at that rate.
  const int keepalive_ms = static_cast<int>(config.keepalive_seconds * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.RegisterService(&service);
  if (metrics != nullptr) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
    interceptors.push_back(metrics->NewInterceptorFactory());
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  const mode_t old_umask = ::umask(0177);  // the Unix socket is created 0600
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ::umask(old_umask);
  if (server == nullptr || (!config.listen.empty() && port == 0)) {
    scheduler.Drain(absl::ZeroDuration());
    return Fail(absl::UnavailableError(absl::StrCat("cannot listen on ", config.listen.empty() ? "" : config.listen,
                                                    config.unix_socket ? " " + config.unix_socket_path : "")));
  }
  if (config.unix_socket) ::chmod(config.unix_socket_path.c_str(), 0600);
  // The plaintext health port (CONVENTIONS.md §2: Kubernetes' gRPC probes cannot do TLS): a
  // server of its own whose only service is the default grpc.health.v1 one (every server built
  // while EnableDefaultHealthCheckService is on has it), so no job method is reachable there
  // without TLS or a token. Its status follows the main server's.
  std::unique_ptr<grpc::Server> health_server;
  int health_port = 0;
  if (!config.health_listen.empty()) {
    grpc::ServerBuilder health_builder;
    health_builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    health_builder.AddListeningPort(config.health_listen, grpc::InsecureServerCredentials(), &health_port);
    health_server = health_builder.BuildAndStart();
    if (health_server == nullptr || health_port == 0) {
      scheduler.Drain(absl::ZeroDuration());
      server->Shutdown();
      return Fail(
          absl::UnavailableError(absl::StrCat("server.health_listen: cannot listen on ", config.health_listen)));
    }
  }
  const auto set_serving = [&](bool serving) {
    server->GetHealthCheckService()->SetServingStatus(serving);
    if (health_server != nullptr) health_server->GetHealthCheckService()->SetServingStatus(serving);
  };
  const std::string metrics_port_file = config.data_dir + "/oombd.metrics.port";
  if (metrics != nullptr) {
    const size_t colon = config.metrics_listen.rfind(':');  // a bare port listens on every address
    const std::string host = colon == std::string::npos ? "0.0.0.0" : config.metrics_listen.substr(0, colon);
    std::cerr << "oombd: metrics on http://" << host << ":" << metrics->port() << "/metrics" << std::endl;
    if (absl::Status s = data_dir->WriteFileAtomic("oombd.metrics.port", absl::StrCat(metrics->port(), "\n"));
        !s.ok()) {
      return Fail(s);
    }
  }
  // oombd.port is written last: whoever waits for it finds the other port files already there.
  const std::string health_port_file = config.data_dir + "/oombd.health.port";
  if (health_server != nullptr) {
    std::cerr << "oombd: health (plaintext grpc.health.v1) on " << BoundAddress(config.health_listen, health_port)
              << std::endl;
    if (absl::Status s = data_dir->WriteFileAtomic("oombd.health.port", absl::StrCat(health_port, "\n")); !s.ok())
      return Fail(s);
  }
  const std::string port_file = config.data_dir + "/oombd.port";
  if (!config.listen.empty()) {
    const std::string host = config.listen.substr(0, config.listen.rfind(':'));
    std::cerr << "oombd: listening on " << host << ":" << port << std::endl;
    if (absl::Status s = data_dir->WriteFileAtomic("oombd.port", absl::StrCat(port, "\n")); !s.ok()) return Fail(s);
  }
  if (config.unix_socket) std::cerr << "oombd: listening on unix:" << config.unix_socket_path << std::endl;
  set_serving(true);

  // What systemd shows (`systemctl status oombd`): the addresses, then the store's job counts.
  std::vector<std::string> addresses;
  if (!config.listen.empty()) addresses.push_back(BoundAddress(config.listen, port));
  if (config.unix_socket) addresses.push_back("unix:" + config.unix_socket_path);
  if (health_server != nullptr) addresses.push_back("health " + BoundAddress(config.health_listen, health_port));
  if (metrics != nullptr) addresses.push_back("metrics " + BoundAddress(config.metrics_listen, metrics->port()));
  const std::string serving_on = absl::StrCat("serving on ", absl::StrJoin(addresses, ", "));
  JobStore* const status_store = store->get();
  std::atomic<bool> draining{false};
  const auto status = [&draining, status_store, serving_on, grace = config.shutdown_grace_seconds] {
    const std::string jobs = JobCounts(status_store);
    if (!draining.load()) return absl::StrCat(serving_on, "; ", jobs);
    return absl::StrCat("draining: running jobs checkpoint (at most ", grace, " s); ", jobs);
  };
  SystemdNotifier systemd(status);
  systemd.Ready();

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: shutting down", sig);
  draining.store(true);
  set_serving(false);
  systemd.Stopping();
  const bool stopped = scheduler.Drain(absl::Seconds(config.shutdown_grace_seconds));
  if (!stopped) spdlog::warn("jobs still running after {} s; they resume on restart", config.shutdown_grace_seconds);
  hub.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (health_server != nullptr) {  // last: probes see NOT_SERVING until the main server is down
    health_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    ::unlink(health_port_file.c_str());
  }
  ::unlink(port_file.c_str());
  if (metrics != nullptr) ::unlink(metrics_port_file.c_str());
  if (config.unix_socket) ::unlink(config.unix_socket_path.c_str());
  std::cerr << "oombd: stopped" << std::endl;
  if (!stopped) {
    std::fflush(nullptr);
    std::_Exit(0);  // detached device threads still run: skip static destructors
  }
  return 0;
}

}  // namespace oomb::server
