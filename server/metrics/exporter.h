// The daemon's Prometheus endpoint: GET /metrics on its own HTTP port (prometheus-cpp's
// exposer, text format), every family named and explained in docs/metrics.md.
//
// Where the numbers come from:
//   - events, as they happen: the scheduler reports runs, steps, checkpoints and state changes
//     through the MetricsSink this class implements; gRPC calls are counted by the server
//     interceptor from NewInterceptorFactory() (one place for every service and method);
//   - values read at scrape time, by a prometheus::Collectable (ScrapeCollector, no polling
//     thread): jobs by state and the projects' usage and quotas from the store and the projects
//     file, the CUDA caching allocator's and NVML's device memory and PCIe counters, KV pages
//     and transfers from the KvStatsRegistry, pinned host bytes.
//
// Cardinality is bounded: per-device series are labelled `gpu` and `UUID` (DCGM's spelling, so
// dashboards can join with DCGM_FI_* series) or `slot` (a scheduler device); a job appears as
// `oomb_job_info{slot,job_id,project,model} 1` and its per-job gauges, labelled `slot`, `job_id`
// and `project`, while it runs on a slot of this daemon (removed when its run stops), and as
// `oomb_job_end_time_seconds{job_id,project,state,reason}` for an hour after its run ended here
// (or it reached a final state here without running); a project only when
// tenancy.projects_file lists it. gRPC labels come from the methods the server registers.
// (`job_id`, not `job`: Prometheus gives every scraped series the target's `job` label.)
//
// Thread-safety: every method may be called from any thread.
#ifndef OOMB_SERVER_METRICS_EXPORTER_H_
#define OOMB_SERVER_METRICS_EXPORTER_H_

#include <grpcpp/support/server_interceptor.h>
#include <prometheus/labels.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "oomb/v1/jobs.pb.h"
#include "server/metrics/metrics_sink.h"
#include "server/projects.h"
#include "server/store/job_store.h"
#include "worker/job/build_info.h"
#include "worker/metrics/kv_stats.h"

namespace prometheus {
class Counter;
class Exposer;
template <typename T>
class Family;
class Gauge;
class Histogram;
class Registry;
}  // namespace prometheus

namespace oomb::server {

class ScrapeCollector;

// One project of tenancy.projects_file as /metrics shows it (the label set is bounded by the
// file: projects it does not list are not exported one by one).
struct ProjectSample {
  std::string project;
  ProjectUsage usage;        // what its jobs hold and used now (JobStore::Usage)
  ProjectSettings settings;  // its quotas; 0: none
};

struct MetricsExporterOptions {
  // "host:port" to serve /metrics on; port 0 picks a free port (see port()); empty: no HTTP
  // server (Scrape() still works).
  std::string listen;
  // The scheduler's devices: their slot series exist (at zero) from the start, so the first
  // increment of a counter is seen by rate().
  std::vector<std::string> slots;
  // oomb_build_info's labels (version, git_sha, torch, cuda).
  BuildInfo build;
  // Read at scrape time. Each may be unset; its families are then absent.
  KvStatsRegistry* kv_stats = nullptr;  // must outlive the exporter
  std::function<absl::StatusOr<std::map<v1::Job::State, int64_t>>()> count_jobs;
  std::function<absl::StatusOr<std::vector<ProjectSample>>()> projects;
  std::function<std::vector<DeviceMemoryStats>()> device_memory;  // CUDA devices; empty on the CPU
  std::function<int64_t()> pinned_host_bytes;
  std::function<absl::StatusOr<int64_t>()> pending_webhooks;  // JobStore::PendingWebhooks
  // Load NVML (libnvidia-ml.so.1) for device-wide memory and PCIe counters when present.
  bool nvml = true;
};

class MetricsExporter final : public MetricsSink {
 public:
  // Builds the families and, with `listen` set, starts serving. UNAVAILABLE naming the address
  // when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(MetricsExporterOptions options);
  ~MetricsExporter() override;  // stops serving
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // The bound port; 0 without an HTTP server.
  int port() const { return port_; }

  // For grpc::ServerBuilder::experimental().SetInterceptorCreators(): counts every RPC the
  // server finishes by service, method and status code, and times unary ones. The exporter
  // must outlive the server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewInterceptorFactory();

  // What a scrape of /metrics returns now.
  std::string Scrape() const;

  // MetricsSink.
  void RunStarted(const std::string& slot, const v1::Job& job, absl::Duration queue_wait) override;
  void Step(const std::string& slot, const StepReport& progress) override;
  void CheckpointSaved(const std::string& slot, const CheckpointInfo& checkpoint) override;
  void RunStopped(const std::string& slot) override;
  void StateEntered(const v1::Job& job, v1::Job::State state) override;

  // One webhook attempt ended (server/notify/webhook_sender.h): "delivered", "failed" (to be
  // retried) or "given_up".
  void WebhookAttempt(const std::string& result);

  // Records one finished RPC (what the interceptor calls). `seconds` < 0: not timed (streams).
  void RpcFinished(const std::string& full_method, int code, double seconds);

 private:
  // The gauges of the job running on a slot; removed when its run stops. Those of its last step
  // exist from its first step (or, for a run that resumes, from its start, with the values of
  // the step before).
  struct JobSeries {
    std::string id;             // the job's id
    prometheus::Labels labels;  // slot, job_id, project
    prometheus::Gauge* info = nullptr;
    prometheus::Gauge* start_time = nullptr;
    prometheus::Gauge* device_memory_peak = nullptr;
    prometheus::Gauge* host_kv = nullptr;
    prometheus::Gauge* step = nullptr;
    prometheus::Gauge* total_steps = nullptr;
    prometheus::Gauge* loss = nullptr;
    prometheus::Gauge* learning_rate = nullptr;
    prometheus::Gauge* tokens_per_second = nullptr;
    prometheus::Gauge* eta = nullptr;
    prometheus::Gauge* swapped_bytes = nullptr;
    prometheus::Gauge* swapped_chunks = nullptr;
    prometheus::Gauge* eval_loss = nullptr;  // after the first evaluation
    // The evaluation section's results: accuracy by retrieval suite, loss by position bucket.
    std::map<std::string, prometheus::Gauge*> eval_accuracy, eval_position_loss;
    // ruler: by "task@length", by length, and the effective length.
    std::map<std::string, prometheus::Gauge*> eval_ruler_score, eval_ruler_average;
    prometheus::Gauge* eval_ruler_effective_length = nullptr;
    prometheus::Gauge* mfu = nullptr;                // where the device's peak is known
    prometheus::Gauge* attention_density = nullptr;  // sparse attention only
    prometheus::Gauge* router_aux_loss = nullptr;    // the router's auxiliary loss only
  };
  struct SlotSeries {
    prometheus::Gauge* busy = nullptr;
    prometheus::Counter* tokens = nullptr;
    prometheus::Counter* steps = nullptr;
    prometheus::Counter* model_flops = nullptr;
    prometheus::Counter* checkpoints = nullptr;
    prometheus::Counter* checkpoint_bytes = nullptr;
    prometheus::Histogram* step_seconds = nullptr;
    prometheus::Histogram* forward_chunk_seconds = nullptr;
    prometheus::Histogram* backward_chunk_seconds = nullptr;
    prometheus::Histogram* checkpoint_seconds = nullptr;
    bool has_job = false;
    JobSeries job;
  };
  // What a job's last step measured (StepReport; Progress for a run that resumes).
  struct LastStep {
    double loss = 0, learning_rate = 0, tokens_per_second = 0, eta_seconds = 0;
    double device_bytes = 0, host_kv_bytes = 0, swapped_bytes = 0, swapped_chunks = 0;
  };
  // The end of a job's last run (oomb_job_end_time_seconds), kept kEndedKept.
  struct Ended {
    absl::Time when;
    prometheus::Gauge* series = nullptr;
  };
  static constexpr absl::Duration kEndedKept = absl::Hours(1);
  struct Families;

  explicit MetricsExporter(MetricsExporterOptions options);
  SlotSeries& SlotLocked(const std::string& slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveJobLocked(SlotSeries& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvaluatedLocked(const EvalReport& e, JobSeries& j) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ruler suite's scores, averages and effective length.
  void RulerLocked(const SuiteResult& r, JobSeries& j) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetLastStepLocked(JobSeries& j, const LastStep& v) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the end-time series older than kEndedKept.
  void PruneEndedLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MetricsExporterOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Families> f_;
  std::shared_ptr<ScrapeCollector> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;

  absl::Mutex mu_;
  std::map<std::string, SlotSeries> slots_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Ended> ended_ ABSL_GUARDED_BY(mu_);  // by job id
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_METRICS_EXPORTER_H_
