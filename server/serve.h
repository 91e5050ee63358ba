// `oombd serve`: starts the daemon (server/daemon.h), runs until SIGTERM or SIGINT, then shuts
// it down, giving running jobs server.shutdown_grace_seconds to checkpoint (docs/CONVENTIONS.md §2).
#ifndef OOMB_SERVER_SERVE_H_
#define OOMB_SERVER_SERVE_H_

#include <functional>
#include <string>
#include <vector>

#include "oomb/v1/jobs.pb.h"
#include "server/config.h"
#include "server/engine_rates_store.h"
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
  // EstimateJob's rates (server/engine_rates_store.h; production: MeasureEngineRates and
  // EngineRatesKey of worker/job/calibration.h); unset: no time and cost estimates.
  EngineRatesStore::Measure measure_rates;
  EngineRatesStore::Key rates_key;
  v1::ServerInfo server_info;  // versions and devices; start time and draining are filled in
  // For /metrics: oomb_build_info's labels, and values read at scrape time (production:
  // GetDeviceMemoryStats and GetPinnedHostBytes from worker/job/build_info.h); unset: absent.
  BuildInfo build;
  std::function<std::vector<DeviceMemoryStats>()> device_memory;
  std::function<int64_t()> pinned_host_bytes;
};

// Returns the process exit code: 0 after a shutdown, 1 on a startup error (printed).
int Serve(const ServerConfig& config, const ServeEnvironment& env);

}  // namespace oomb::server

#endif  // OOMB_SERVER_SERVE_H_
