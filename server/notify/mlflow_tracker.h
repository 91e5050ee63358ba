// MLflow tracking (spec.tracking.mlflow, tracking.mlflow_uri): each tracked job's run logged to
// an MLflow tracking server through its REST API (/api/2.0/mlflow/...), docs/API.md "Tracking".
//
// What a run gets: the experiment (default "oomb/{project}", made when absent) and a run named
// by the spec (default: the job's id) with tags oomb.job, oomb.project, oomb.version; params, the
// job's spec with its defaults filled in, flattened ("training.learning_rate"); per step the
// metrics loss, learning_rate, tokens_per_second, step_seconds, mfu, peak_device_bytes,
// host_kv_bytes, pcie_h2d_bytes, pcie_d2h_bytes, tokens, eval_loss and router_aux_loss (where
// the step has them), and the evaluation's
// eval.{suite}.accuracy and eval.positions.loss.{begin}-{end}; at the end the tag
// oomb.final_checkpoint (the final adapter's directory) and the run's status (FINISHED, FAILED
// or KILLED). A paused or preempted job leaves its run RUNNING and goes on logging to it when it
// resumes (Job.mlflow_run, recorded in the store).
//
// It never slows a step: the scheduler's reports (it is a MetricsSink) only append to a
// buffer; one thread sends the buffers every `flush_every` with runs/log-batch (1000 metrics a
// call). When the server cannot be reached, refuses, or answers what is not MLflow's answer
// (server/notify/remote_answers.h reads every answer, whatever its bytes), nothing fails: the
// buffer is kept and sent again later (a warning logged, and a WARNING event on the job, once
// until it works again); a job whose buffer grows past `max_buffered` metrics drops its oldest
// (logged).
//
// Whose server: the operator's is tracking.mlflow_uri (`default_uri`), used by jobs that name
// none or name the same server (SameServer); only it gets the operator's token, and it is not
// checked. A server a job names otherwise gets no token of the operator's and is reached only
// where the job's project's destination policy allows (server/notify/destination_policy.h),
// checked at every connection: a refused one leaves the job untracked, with a WARNING event
// saying why. Whose token: a job that names spec.tracking.mlflow.token_secret sends that secret
// of its project (`secret`) to its server, whichever it is, and never the operator's; a secret
// that cannot be read is a failure of that job's tracking (a WARNING event, retried later).
//
// Thread-safety: the MetricsSink methods from any thread; Start and Stop from one.
#ifndef OOMB_SERVER_NOTIFY_MLFLOW_TRACKER_H_
#define OOMB_SERVER_NOTIFY_MLFLOW_TRACKER_H_

#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/metrics/metrics_sink.h"
#include "server/notify/destination_policy.h"
#include "server/store/job_store.h"

namespace oomb::server {

struct MlflowTrackerOptions {
  std::string default_uri = {};  // tracking.mlflow_uri; empty: only jobs that name one
  std::string token = {};        // tracking.mlflow_token_file's token: to default_uri's server only
  std::string ca_file = {};      // notifications.ca_file
  std::string version = {};      // oomb.version tag
  absl::Duration flush_every = absl::Seconds(2);
  absl::Duration request_timeout = absl::Seconds(10);
  size_t max_buffered = 1000000;  // metrics held per job while the server is away
  // Where a job may name its own server (server/notify/destination_policy.h); null: public
  // addresses only. The default_uri's server (named or defaulted to) is the operator's: unchecked.
  DestinationPolicyOf destinations = {};
  // A project's secret by name (ProjectSettings::secrets, read at each use so that it can be
  // rotated): the token of a job that names spec.tracking.mlflow.token_secret. Null: none.
  std::function<absl::StatusOr<std::string>(const std::string& project, const std::string& name)> secret = {};
};

// The MLflow REST calls a run needs, against one tracking server.
class MlflowClient {
 public:
  // `token` empty: none sent. `destinations`: who `uri` may reach (SendHttp).
  MlflowClient(std::string uri, std::string token, std::string ca_file, absl::Duration timeout,
               DestinationPolicy destinations);
  // The id of `name`, made when absent.
  absl::StatusOr<std::string> Experiment(const std::string& name);
  // A new run; its id.
  absl::StatusOr<std::string> CreateRun(const std::string& experiment_id, const std::string& run_name,
                                        const std::map<std::string, std::string>& tags);
  // runs/log-batch: at most 1000 metrics, 100 params and 100 tags a call (MLflow's limits).
  absl::Status LogBatch(const std::string& run_id, const nlohmann::json& metrics, const nlohmann::json& params,
                        const nlohmann::json& tags);
  // runs/update: FINISHED, FAILED or KILLED, ended now.
  absl::Status EndRun(const std::string& run_id, const std::string& status);

 private:
  absl::StatusOr<nlohmann::json> Call(const std::string& method, const std::string& path, const nlohmann::json& body);
  const std::string uri_, token_, ca_file_;
  const absl::Duration timeout_;
  const DestinationPolicy destinations_;
};

class MlflowTracker final : public MetricsSink {
 public:
  MlflowTracker(JobStore* store, MlflowTrackerOptions options);
  ~MlflowTracker() override;  // Stop()

  void Start();
  // Sends what is buffered once more (best effort), then stops the thread.
  void Stop();

  // MetricsSink.
  void RunStarted(const std::string& slot, const v1::Job& job, absl::Duration queue_wait) override;
  void Step(const std::string& slot, const StepReport& progress) override;
  void CheckpointSaved(const std::string& slot, const CheckpointInfo& checkpoint) override;
  void RunStopped(const std::string& slot) override;
  void StateEntered(const v1::Job&, v1::Job::State) override {}

  // One pass of the thread: makes runs, sends buffers, ends the runs of jobs that ended.
  void Flush();

  // The params of a spec: its fields flattened to "section.field" (lists as JSON).
  static std::map<std::string, std::string> SpecParams(const v1::JobSpec& spec);
  // A step's metrics as MLflow metric objects {key, value, timestamp, step}.
  static nlohmann::json StepMetrics(const StepReport& step, int64_t timestamp_ms);

 private:
  struct Run {
    v1::Job job;                         // as it started (its spec, its mlflow_run)
    std::string uri;                     // the tracking server
    bool operators = false;              // uri is tracking.mlflow_uri's: the token goes to it
    std::string run_id;                  // empty until made
    std::deque<nlohmann::json> metrics;  // not yet sent
    std::string final_checkpoint;
    bool params_sent = false;
    bool stopped = false;  // its run returned; ended once its state is final
    bool warned = false;   // a failure was logged; the next success is too
    bool refused = false;  // the destination policy refused its server: not tracked
  };
  // The tracking server of `job`; empty: not tracked.
  std::string UriOf(const v1::Job& job) const;
  // The client for `run`'s server: no destination check for the operator's server, the job's
  // project's policy for any other; the job's own token (token_secret) where it names one, else
  // the operator's token to the operator's server only.
  absl::StatusOr<MlflowClient> ClientOf(const Run& run) const;
  // Makes or finds the run, sends params, metrics, and the end; false when the job is done with.
  bool FlushOne(const std::string& job_id, Run* run);
  absl::Status EnsureRun(const std::string& job_id, Run* run);
  // Appends a WARNING event to the job (what `oomb logs` and WatchJob show its owner).
  void WarnJob(const std::string& job_id, const std::string& message);
  void Loop();

  JobStore* const store_;
  const MlflowTrackerOptions options_;
  absl::Mutex mu_;
  std::map<std::string, std::string> slots_ ABSL_GUARDED_BY(mu_);  // slot -> job id
  std::map<std::string, Run> runs_ ABSL_GUARDED_BY(mu_);           // by job id
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex flush_mu_;  // one Flush at a time
  std::thread thread_;
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_NOTIFY_MLFLOW_TRACKER_H_
