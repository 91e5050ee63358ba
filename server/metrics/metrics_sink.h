// What the scheduler reports to the metrics exporter: job runs starting and stopping on a slot,
// their steps and checkpoints, and every state a job enters. The Prometheus implementation is
// MetricsExporter (server/metrics/exporter.h); tests record the calls.
//
// A slot is one of the scheduler's devices ("cpu", "cuda:0"): it runs one job at a time, so
// per-job series labelled by slot stay bounded by the number of devices.
//
// Thread-safety: called concurrently from the scheduler's device threads and RPC threads,
// sometimes with the scheduler's lock held: implementations must be thread-safe, quick, and
// must not call back into the scheduler.
#ifndef OOMB_SERVER_METRICS_METRICS_SINK_H_
#define OOMB_SERVER_METRICS_METRICS_SINK_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "oomb/v1/jobs.pb.h"
#include "worker/job/executor.h"

namespace oomb::server {

class MetricsSink {
 public:
  virtual ~MetricsSink() = default;

  // A device thread claimed `job` (now RUNNING) after it waited `queue_wait` in this process's
  // queue.
  virtual void RunStarted(const std::string& slot, const v1::Job& job, absl::Duration queue_wait) = 0;
  // An optimizer step of the run on `slot` finished.
  virtual void Step(const std::string& slot, const StepReport& progress) = 0;
  // The run on `slot` wrote a checkpoint (it is durable).
  virtual void CheckpointSaved(const std::string& slot, const CheckpointInfo& checkpoint) = 0;
  // The run on `slot` returned, whatever its outcome; the slot is idle.
  virtual void RunStopped(const std::string& slot) = 0;
  // A job entered `state` (one call per committed STATE_CHANGED event); `job` as the commit
  // left it (its error set when it FAILED).
  virtual void StateEntered(const v1::Job& job, v1::Job::State state) = 0;
};

// Tells each of its sinks (not null; they outlive it) what it is told, in order: the exporter
// and the MLflow tracker hear the same scheduler.
class MetricsFanOut final : public MetricsSink {
 public:
  explicit MetricsFanOut(std::vector<MetricsSink*> sinks) : sinks_(std::move(sinks)) {}
  void RunStarted(const std::string& slot, const v1::Job& job, absl::Duration queue_wait) override {
    for (MetricsSink* s : sinks_) s->RunStarted(slot, job, queue_wait);
  }
  void Step(const std::string& slot, const StepReport& progress) override {
    for (MetricsSink* s : sinks_) s->Step(slot, progress);
  }
  void CheckpointSaved(const std::string& slot, const CheckpointInfo& checkpoint) override {
    for (MetricsSink* s : sinks_) s->CheckpointSaved(slot, checkpoint);
  }
  void RunStopped(const std::string& slot) override {
    for (MetricsSink* s : sinks_) s->RunStopped(slot);
  }
  void StateEntered(const v1::Job& job, v1::Job::State state) override {
    for (MetricsSink* s : sinks_) s->StateEntered(job, state);
  }

 private:
  const std::vector<MetricsSink*> sinks_;
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_METRICS_METRICS_SINK_H_
