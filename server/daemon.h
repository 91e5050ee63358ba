// The daemon (`oombd serve`): every part it runs, started in order by Start and stopped in
// reverse by Shutdown; it owns every thread it starts (the scheduler's device, validator and
// fleet threads, CreateJob's work pool, the metrics server, the systemd notifier, gRPC's), and
// Shutdown returns only when all of them have ended.
//
// Start (docs/CONVENTIONS.md §2): the data dir (0700, locked: one daemon per data dir), the job-file
// confinement, the store, /metrics (metrics.listen), the scheduler (recovering the previous
// process's jobs) with the MLflow tracker beside /metrics, the webhook sender
// (notifications.*), CreateJob's work pool, the gRPC server, the HTTP/JSON gateway
// (http.listen, server/http/gateway.h) over the gRPC server's in-process channel and, with server.health_listen, a
// plaintext grpc.health.v1 server (Kubernetes' probes cannot do TLS) whose status follows the main one. Readiness: once
// every port is bound it prints "oombd: listening on HOST:PORT" (and the metrics, HTTP and health addresses) on stderr,
// writes the ports to <data_dir>/oombd.port, oombd.metrics.port, oombd.http.port and oombd.health.port (oombd.port
// last: whoever waits for it finds the others), and tells systemd READY=1 (Type=notify), refreshing STATUS= with the
// addresses and the store's job counts every 5 s and sending WATCHDOG=1 at half of WatchdogSec= when the unit sets it.
//
// Shutdown(deadline):
//   1. health NOT_SERVING, systemd STOPPING=1, new work refused with UNAVAILABLE;
//   2. running jobs asked to checkpoint and stop until `deadline` (they are QUEUED and resume
//      from that checkpoint on restart, or at once on another daemon of a fleet); a job still
//      running then stops at its next chunk boundary without one (QUEUED, to resume from its
//      last checkpoint) and its thread is joined;
//   3. WatchJob streams ended (UNAVAILABLE, with the sequence to resume from);
//   4. the webhook sender stops after its attempt in flight (what it has not delivered stays in
//      the store's outbox for the next start); the HTTP gateway stops (its open streams end), the gRPC servers shut
//      down (open RPCs get 5 s), the port files and the socket removed.
//
// Thread-safety: Start and Shutdown from one thread (main's).
#ifndef OOMB_SERVER_DAEMON_H_
#define OOMB_SERVER_DAEMON_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/config.h"
#include "server/data_dir_lock.h"
#include "server/dataset_service.h"
#include "server/engine_rates_store.h"
#include "server/http/gateway.h"
#include "server/job_files.h"
#include "server/job_service.h"
#include "server/metrics/exporter.h"
#include "server/notify/mlflow_tracker.h"
#include "server/notify/webhook_sender.h"
#include "server/retention.h"
#include "server/scheduler.h"
#include "server/serve.h"
#include "server/store/job_store.h"
#include "server/watch_hub.h"
#include "server/work_pool.h"
#include "worker/common/file_access.h"
#include "worker/metrics/kv_stats.h"

namespace oomb::server {

class SystemdNotifier;

class Daemon {
 public:
  // Starts every part; the first error (printed by the caller) undoes what was started.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const ServerConfig& config, const ServeEnvironment& env);
  ~Daemon();  // Shutdown(now) unless it ran
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Stops the daemon (see the file comment). Returns whether every running job stopped at a
  // checkpoint of its own before `deadline`.
  bool Shutdown(absl::Time deadline);

 private:
  Daemon(const ServerConfig& config, const ServeEnvironment& env);

  absl::Status OpenDataDir();
  absl::Status OpenStore();
  absl::Status StartMetrics();
  absl::Status StartScheduler();
  void StartWebhooks();
  absl::Status StartServers();
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpCredentials() const;
  absl::Status StartHealthServer();
  absl::Status StartHttpGateway();
  // Prints the addresses and writes the port files.
  absl::Status Announce();
  absl::Status WritePortFile(const std::string& name, int port);
  void SetServing(bool serving);
  // The systemd status line: the addresses, or the drain, and the store's job counts.
  std::string Status() const;

  const ServerConfig config_;
  const ServeEnvironment env_;
  // In the order they start; stopped in reverse (Shutdown, then the destructors).
  std::optional<Dir> data_dir_;
  std::optional<DataDirLock> lock_;
  std::shared_ptr<const JobFiles> files_;
  std::unique_ptr<Authenticator> auth_;              // who calls (server/auth.h)
  std::unique_ptr<Authorizer> authorizer_;           // what they may do (server/authorization.h)
  std::shared_ptr<const ProjectRegistry> projects_;  // tenancy.projects_file (server/projects.h)
  DestinationPolicyOf destinations_;  // outbound.* and the projects' (server/notify/destination_policy.h)
  std::unique_ptr<JobStore> store_;
  KvStatsRegistry kv_stats_;
  std::unique_ptr<MetricsExporter> metrics_;
  WatchHub hub_;
  std::unique_ptr<MlflowTracker> tracker_;  // spec.tracking.mlflow (server/notify/mlflow_tracker.h)
  std::unique_ptr<MetricsFanOut> sinks_;    // what the scheduler reports to: the tracker, /metrics
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<WebhookSender> webhooks_;  // delivers the outbox (server/notify/webhook_sender.h)
  std::unique_ptr<WorkPool> create_pool_;    // CreateJob's checks, off gRPC's threads
  std::unique_ptr<JobServiceImpl> service_;
  std::unique_ptr<DatasetServiceImpl> datasets_;
  std::unique_ptr<RetentionSweeper> retention_;  // storage.retention_days > 0
  std::unique_ptr<EngineRatesStore> rates_;      // ServeEnvironment::measure_rates set
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> health_server_;
  std::unique_ptr<HttpGateway> http_;
  std::string gateway_key_;  // believed by auth_ on the gateway's in-process calls
  int port_ = 0, health_port_ = 0;
  std::vector<std::string> addresses_;    // what it serves on, for the status line
  std::vector<std::string> owned_paths_;  // the port files and the socket it made, removed at shutdown
  std::unique_ptr<SystemdNotifier> systemd_;
  std::atomic<bool> draining_{false};
  bool shut_down_ = false;
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_DAEMON_H_
