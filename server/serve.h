// `oombd serve`: opens the store, recovers jobs, starts the scheduler and the gRPC server, and
// runs until SIGTERM or SIGINT, then shuts down in order (CONVENTIONS.md §2):
//   1. health NOT_SERVING, new work refused with UNAVAILABLE;
//   2. running jobs asked to checkpoint and stop (they resume when the daemon restarts), for at
//      most server.shutdown_grace_seconds;
//   3. WatchJob streams finished (UNAVAILABLE, with the sequence to resume from);
//   4. grpc::Server::Shutdown(deadline).
// Readiness: after the store is recovered and every port is bound, prints
// "oombd: listening on HOST:PORT" on stderr, writes the port to <data_dir>/oombd.port and sends
// sd_notify READY=1 when NOTIFY_SOCKET is set. With metrics.listen set, /metrics is served
// (server/metrics/exporter.h) and "oombd: metrics on http://HOST:PORT/metrics" printed and the
// port written to <data_dir>/oombd.metrics.port first. With server.health_listen set, a second,
// plaintext gRPC server answers grpc.health.v1 only (for Kubernetes probes, which cannot do
// TLS), with the same status as the main one; "oombd: health (plaintext grpc.health.v1) on
// HOST:PORT" is printed and the port written to <data_dir>/oombd.health.port.
// systemd (Type=notify, sd_notify(3)): READY=1 as above; STATUS= with the addresses and the
// store's job counts, refreshed every 5 s; WATCHDOG=1 at half of WatchdogSec= when the unit
// sets it; STOPPING=1 (health NOT_SERVING already) when the drain begins.
#ifndef OOMB_SERVER_SERVE_H_
#define OOMB_SERVER_SERVE_H_

#include <functional>
#include <string>
#include <vector>

#include "oomb/v1/jobs.pb.h"
#include "server/config.h"
#include "server/scheduler.h"
#include "worker/job/build_info.h"

namespace oomb::server {

// What the daemon's main provides: the hardware and the trainer (tests may inject others).
struct ServeEnvironment {
  std::vector<std::string> devices;  // used when config.devices == "auto"
  JobRunner runner;
  // The dataset scan: CreateJob's for small datasets (JobServiceOptions::validate_data) and
  // the VALIDATING state's (SchedulerOptions::validator); empty: none.
  std::function<absl::StatusOr<DataSummary>(const JobConfig&, const FileAccess&)> validate_data;
  v1::ServerInfo server_info;  // versions and devices; start time and draining are filled in
  // For /metrics: oomb_build_info's labels, and values read at scrape time (production:
  // GetDeviceMemoryStats and GetPinnedHostBytes from worker/job/build_info.h); unset: absent.
  BuildInfo build;
  std::function<std::vector<DeviceMemoryStats>()> device_memory;
  std::function<int64_t()> pinned_host_bytes;
};

// Returns the process exit code: 0 after a clean shutdown, 1 on a startup error (printed).
int Serve(const ServerConfig& config, const ServeEnvironment& env);

}  // namespace oomb::server

#endif  // OOMB_SERVER_SERVE_H_
