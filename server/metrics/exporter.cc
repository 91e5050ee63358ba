#include "server/metrics/exporter.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/support/interceptor.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "grpc/health/v1/health.pb.h"
#include "server/metrics/scrape_collector.h"
#include "server/store/job_store.h"

namespace oomb::server {
namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;

// Bucket upper bounds, seconds. Steps run from milliseconds (tiny models on the CPU) to many
// minutes (a million tokens on one GPU); chunks from a millisecond to minutes.
const Histogram::BucketBoundaries kStepBuckets = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,    2.5,  5,
                                                  10,   25,    50,   100, 250,  500, 1000, 2500, 5000};
const Histogram::BucketBoundaries kChunkBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                   0.5,   1,      2.5,   5,    10,    25,   50,  100};
const Histogram::BucketBoundaries kQueueBuckets = {0.1, 1,    5,    15,   30,    60,    300,
                                                   900, 1800, 3600, 7200, 14400, 43200, 86400};
const Histogram::BucketBoundaries kCheckpointBuckets = {0.01, 0.05, 0.1, 0.25, 0.5, 1,   2.5,
                                                        5,    10,   30,  60,   120, 300, 600};
const Histogram::BucketBoundaries kRpcBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                 0.1,    0.25,  0.5,    1,     2.5,  5,     10};

double UnixSeconds(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

// "models/Qwen2.5-7B/" -> "Qwen2.5-7B": the job_info label names the model, not the path.
std::string ModelName(const std::string& path) {
  absl::string_view p = path;
  while (absl::ConsumeSuffix(&p, "/")) {
  }
  const size_t slash = p.rfind('/');
  return std::string(slash == absl::string_view::npos ? p : p.substr(slash + 1));
}

// gRPC's canonical code names, as grpc-go and grpc_health_probe print them.
const char* CodeName(int code) {
  static constexpr const char* kNames[] = {
      "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS", "UNAUTHENTICATED"};
  return code >= 0 && code < static_cast<int>(std::size(kNames)) ? kNames[code] : "UNKNOWN";
}

// "/oomb.v1.JobService/GetJob" -> {"oomb.v1.JobService", "GetJob"} when the method is one of
// the linked services' (the only ones the server registers); anything else is "unknown", so a
// client cannot create series by calling made-up methods.
std::pair<std::string, std::string> ServiceAndMethod(const std::string& full_method) {
  std::vector<std::string> parts = absl::StrSplit(full_method, '/');
  if (parts.size() == 3 && parts[0].empty() &&
      google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(absl::StrCat(parts[1], ".", parts[2])) !=
          nullptr) {
    return {parts[1], parts[2]};
  }
  return {"unknown", "unknown"};
}

class RpcInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcInterceptor(MetricsExporter* exporter, grpc::experimental::ServerRpcInfo* info)
      : exporter_(exporter),
        method_(info->method() != nullptr ? info->method() : ""),
        unary_(info->type() == grpc::experimental::ServerRpcInfo::Type::UNARY),
        start_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const double seconds =
          unary_ ? std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() : -1;
      exporter_->RpcFinished(method_, static_cast<int>(methods->GetSendStatus().error_code()), seconds);
    }
    methods->Proceed();
  }

 private:
  MetricsExporter* const exporter_;
  const std::string method_;
  const bool unary_;
  const std::chrono::steady_clock::time_point start_;
};

class RpcInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcInterceptorFactory(MetricsExporter* exporter) : exporter_(exporter) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new RpcInterceptor(exporter_, info);
  }

 private:
  MetricsExporter* const exporter_;
};

template <typename Builder>
auto& Register(Builder builder, prometheus::Registry& r, const char* name, const char* help) {
  return builder.Name(name).Help(help).Register(r);
}
Family<Gauge>& NewGauge(prometheus::Registry& r, const char* name, const char* help) {
  return Register(prometheus::BuildGauge(), r, name, help);
}
Family<Counter>& NewCounter(prometheus::Registry& r, const char* name, const char* help) {
  return Register(prometheus::BuildCounter(), r, name, help);
}
Family<Histogram>& NewHistogram(prometheus::Registry& r, const char* name, const char* help) {
  return Register(prometheus::BuildHistogram(), r, name, help);
}

}  // namespace

// The families whose series the exporter updates as events happen (the scrape-time ones are
// ScrapeCollector's). Help texts match docs/metrics.md.
struct MetricsExporter::Families {
  explicit Families(prometheus::Registry& r)
      : build_info(NewGauge(r, "oomb_build_info", "Always 1; the labels say what this daemon was built from.")),
        start_time(
            NewGauge(r, "oomb_start_time_seconds", "When this daemon started, in seconds since the Unix epoch.")),
        transitions(NewCounter(r, "oomb_job_transitions_total", "Times a job entered each state.")),
        queue_wait(
            NewHistogram(r, "oomb_queue_wait_seconds", "Time a job waited in the queue before a device started it.")),
        slot_busy(NewGauge(r, "oomb_slot_busy", "1 while a job runs on the slot (a scheduler device), else 0.")),
        tokens(NewCounter(r, "oomb_tokens_total",
                          "Tokens trained (every token of every sequence of every finished step).")),
        steps(NewCounter(r, "oomb_steps_total", "Optimizer steps finished.")),
        model_flops(NewCounter(r, "oomb_model_flops_total",
                               "Model FLOPs of the finished steps (6 N T + 6 d L T^2 per sequence).")),
        step_seconds(NewHistogram(r, "oomb_step_duration_seconds", "Duration of an optimizer step.")),
        chunk_seconds(NewHistogram(r, "oomb_chunk_duration_seconds",
                                   "Duration of one chunk of the chunk-recurrent trainer, by stage (forward: stage 1 "
                                   "without a graph; backward: stage 2, recompute and backward).")),
        checkpoints(NewCounter(r, "oomb_checkpoints_total", "Checkpoints written (durable).")),
        checkpoint_bytes(NewCounter(r, "oomb_checkpoint_bytes_total", "Bytes of the checkpoints written.")),
        checkpoint_seconds(
            NewHistogram(r, "oomb_checkpoint_duration_seconds", "Time to write a checkpoint, fsyncs included.")),
        job_info(NewGauge(r, "oomb_job_info",
                          "1 for the job running on a slot; join on (instance, slot) for its job_id, project and "
                          "model.")),
        job_start_time(NewGauge(r, "oomb_job_start_time_seconds",
                                "When the running job's run on this slot started, in seconds since the Unix epoch.")),
        job_end_time(NewGauge(r, "oomb_job_end_time_seconds",
                              "When a job's run ended (state: SUCCEEDED, FAILED, CANCELLED, PAUSED, QUEUED when "
                              "preempted or requeued), in seconds since the Unix epoch; kept for an hour.")),
        job_device_memory_peak(NewGauge(r, "oomb_job_device_memory_peak_bytes",
                                        "Most bytes the running job's last step held on its device at once.")),
        job_host_kv(NewGauge(r, "oomb_job_host_kv_bytes",
                             "KV and KV-gradient bytes the running job's last step held in the host tier at its "
                             "peak.")),
        job_step(NewGauge(r, "oomb_job_step", "Optimizer steps the running job has finished.")),
        job_total_steps(NewGauge(r, "oomb_job_total_steps", "Optimizer steps the running job will take in all.")),
        job_loss(NewGauge(r, "oomb_job_loss", "Mean training loss of the running job's last step.")),
        job_eval_loss(NewGauge(r, "oomb_job_eval_loss", "The running job's last validation loss.")),
        job_eval_accuracy(NewGauge(r, "oomb_job_eval_accuracy_ratio",
                                   "The running job's last evaluation: exact-match accuracy of a retrieval suite "
                                   "(passkey, needle; 0-1).")),
        job_eval_position_loss(NewGauge(r, "oomb_job_eval_position_loss",
                                        "The running job's last evaluation: mean loss of data.validation's tokens "
                                        "at positions [begin, end) of their sample.")),
        job_eval_ruler_score(NewGauge(r, "oomb_job_eval_ruler_score_ratio",
                                      "The running job's last evaluation: RULER's score of a task at a length "
                                      "(string_match_all over its documents; 0-1).")),
        job_eval_ruler_average(NewGauge(r, "oomb_job_eval_ruler_average_ratio",
                                        "The running job's last evaluation: RULER's mean score over the tasks run "
                                        "at a length (0-1).")),
        job_eval_ruler_effective_length(
            NewGauge(r, "oomb_job_eval_ruler_effective_length_tokens",
                     "The running job's last evaluation: RULER's effective length, the longest length whose "
                     "average, and every shorter one's, reaches the threshold (0: the shortest does not).")),
        job_learning_rate(NewGauge(r, "oomb_job_learning_rate", "Learning rate of the running job's last step.")),
        job_tokens_per_second(
            NewGauge(r, "oomb_job_tokens_per_second", "Tokens per second of the running job's last step.")),
        job_eta(NewGauge(r, "oomb_job_eta_seconds", "Estimated seconds until the running job finishes.")),
        job_swapped_bytes(NewGauge(r, "oomb_job_swapped_bytes",
                                   "Attention results the running job's last step kept in host memory instead of "
                                   "recomputing them (memory.swap_attention).")),
        job_swapped_chunks(NewGauge(r, "oomb_job_swapped_chunks",
                                    "Chunks whose attention forward the running job's last step did not recompute.")),
        job_mfu(NewGauge(r, "oomb_job_mfu_ratio",
                         "Model FLOPs utilisation of the running job's last step against the device's datasheet dense "
                         "BF16 peak (0-1; GPUs with a known peak only).")),
        job_attention_density(NewGauge(r, "oomb_job_attention_density_ratio",
                                       "Sparse attention: past KV pages attended / past KV pages there were, over the "
                                       "running job's last step (0-1; jobs with attention.mode: sparse only).")),
        job_router_aux_loss(NewGauge(r, "oomb_job_router_aux_loss",
                                     "A mixture of experts trained with the router's auxiliary loss: the running "
                                     "job's last step's, not weighted (jobs with the loss only).")),
        webhook_attempts(NewCounter(r, "oomb_webhook_attempts_total",
                                    "Webhook deliveries attempted, by result: delivered, failed (retried later), "
                                    "given_up.")),
        rpc_handled(NewCounter(r, "oomb_grpc_server_handled_total",
                               "RPCs the gRPC server finished, by service, method and status code.")),
        rpc_seconds(NewHistogram(r, "oomb_grpc_server_handling_seconds",
                                 "Time from receiving a unary RPC to sending its status.")) {}

  Family<Gauge>& build_info;
  Family<Gauge>& start_time;
  Family<Counter>& transitions;
  Family<Histogram>& queue_wait;
  Family<Gauge>& slot_busy;
  Family<Counter>& tokens;
  Family<Counter>& steps;
  Family<Counter>& model_flops;
  Family<Histogram>& step_seconds;
  Family<Histogram>& chunk_seconds;
  Family<Counter>& checkpoints;
  Family<Counter>& checkpoint_bytes;
  Family<Histogram>& checkpoint_seconds;
  Family<Gauge>& job_info;
  Family<Gauge>& job_start_time;
  Family<Gauge>& job_end_time;
  Family<Gauge>& job_device_memory_peak;
  Family<Gauge>& job_host_kv;
  Family<Gauge>& job_step;
  Family<Gauge>& job_total_steps;
  Family<Gauge>& job_loss;
  Family<Gauge>& job_eval_loss;
  Family<Gauge>& job_eval_accuracy;
  Family<Gauge>& job_eval_position_loss;
  Family<Gauge>& job_eval_ruler_score;
  Family<Gauge>& job_eval_ruler_average;
  Family<Gauge>& job_eval_ruler_effective_length;
  Family<Gauge>& job_learning_rate;
  Family<Gauge>& job_tokens_per_second;
  Family<Gauge>& job_eta;
  Family<Gauge>& job_swapped_bytes;
  Family<Gauge>& job_swapped_chunks;
  Family<Gauge>& job_mfu;
  Family<Gauge>& job_attention_density;
  Family<Gauge>& job_router_aux_loss;
  Family<Counter>& webhook_attempts;
  Family<Counter>& rpc_handled;
  Family<Histogram>& rpc_seconds;
  Histogram* queue_wait_all = nullptr;
};

absl::StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(MetricsExporterOptions options) {
  std::unique_ptr<MetricsExporter> e(new MetricsExporter(std::move(options)));
  if (e->options_.listen.empty()) return e;
  try {
    e->exposer_ = std::make_unique<prometheus::Exposer>(e->options_.listen, /*num_threads=*/2);
  } catch (const std::exception& ex) {
    return absl::UnavailableError(absl::StrCat("metrics.listen: cannot listen on ", e->options_.listen, ": ", ex.what(),
                                               " (choose another address, or \"\" to disable)"));
  }
  const std::vector<int> ports = e->exposer_->GetListeningPorts();
  if (ports.empty() || ports[0] <= 0) {
    return absl::UnavailableError(absl::StrCat("metrics.listen: cannot listen on ", e->options_.listen));
  }
  e->port_ = ports[0];
  e->exposer_->RegisterCollectable(e->registry_);
  e->exposer_->RegisterCollectable(e->collector_);
  return e;
}

MetricsExporter::MetricsExporter(MetricsExporterOptions options)
    : options_(std::move(options)),
      registry_(std::make_shared<prometheus::Registry>()),
      f_(std::make_unique<Families>(*registry_)),
      collector_(std::make_shared<ScrapeCollector>(options_)) {
  // Links grpc.health.v1's descriptors, so ServiceAndMethod() knows the health service.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  f_->build_info
      .Add({{"version", options_.build.version},
            {"git_sha", options_.build.git_sha},
            {"torch", options_.build.torch_version},
            {"cuda", options_.build.cuda_version}})
      .Set(1);
  f_->start_time.Add({}).Set(
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  const google::protobuf::EnumDescriptor* states = v1::Job::State_descriptor();
  for (int i = 0; i < states->value_count(); ++i) {
    if (states->value(i)->number() == v1::Job::STATE_UNSPECIFIED) continue;
    f_->transitions.Add({{"state", states->value(i)->name()}});
  }
  f_->queue_wait_all = &f_->queue_wait.Add({}, kQueueBuckets);
  for (const char* result : {"delivered", "failed", "given_up"}) f_->webhook_attempts.Add({{"result", result}});
  absl::MutexLock lock(&mu_);
  for (const std::string& slot : options_.slots) SlotLocked(slot);
}

MetricsExporter::~MetricsExporter() {
  if (exposer_ != nullptr) {
    exposer_->RemoveCollectable(collector_);
    exposer_->RemoveCollectable(registry_);
  }
}

MetricsExporter::SlotSeries& MetricsExporter::SlotLocked(const std::string& slot) {
  auto [it, inserted] = slots_.try_emplace(slot);
  SlotSeries& s = it->second;
  if (!inserted) return s;
  const prometheus::Labels l = {{"slot", slot}};
  s.busy = &f_->slot_busy.Add(l);
  s.tokens = &f_->tokens.Add(l);
  s.steps = &f_->steps.Add(l);
  s.model_flops = &f_->model_flops.Add(l);
  s.checkpoints = &f_->checkpoints.Add(l);
  s.checkpoint_bytes = &f_->checkpoint_bytes.Add(l);
  s.step_seconds = &f_->step_seconds.Add(l, kStepBuckets);
  s.forward_chunk_seconds = &f_->chunk_seconds.Add({{"slot", slot}, {"stage", "forward"}}, kChunkBuckets);
  s.backward_chunk_seconds = &f_->chunk_seconds.Add({{"slot", slot}, {"stage", "backward"}}, kChunkBuckets);
  s.checkpoint_seconds = &f_->checkpoint_seconds.Add(l, kCheckpointBuckets);
  return s;
}

void MetricsExporter::RemoveJobLocked(SlotSeries& s) {
  if (!s.has_job) return;
  JobSeries& j = s.job;
  f_->job_info.Remove(j.info);
  f_->job_start_time.Remove(j.start_time);
  f_->job_step.Remove(j.step);
  f_->job_total_steps.Remove(j.total_steps);
  const auto remove = [](Family<Gauge>& family, prometheus::Gauge* g) {
    if (g != nullptr) family.Remove(g);
  };
  remove(f_->job_loss, j.loss);
  remove(f_->job_learning_rate, j.learning_rate);
  remove(f_->job_tokens_per_second, j.tokens_per_second);
  remove(f_->job_eta, j.eta);
  remove(f_->job_device_memory_peak, j.device_memory_peak);
  remove(f_->job_host_kv, j.host_kv);
  remove(f_->job_swapped_bytes, j.swapped_bytes);
  remove(f_->job_swapped_chunks, j.swapped_chunks);
  if (j.eval_loss != nullptr) f_->job_eval_loss.Remove(j.eval_loss);
  for (const auto& [suite, g] : j.eval_accuracy) f_->job_eval_accuracy.Remove(g);
  for (const auto& [begin, g] : j.eval_position_loss) f_->job_eval_position_loss.Remove(g);
  for (const auto& [key, g] : j.eval_ruler_score) f_->job_eval_ruler_score.Remove(g);
  for (const auto& [length, g] : j.eval_ruler_average) f_->job_eval_ruler_average.Remove(g);
  if (j.eval_ruler_effective_length != nullptr)
    f_->job_eval_ruler_effective_length.Remove(j.eval_ruler_effective_length);
  if (j.mfu != nullptr) f_->job_mfu.Remove(j.mfu);
  if (j.attention_density != nullptr) f_->job_attention_density.Remove(j.attention_density);
  if (j.router_aux_loss != nullptr) f_->job_router_aux_loss.Remove(j.router_aux_loss);
  s.job = JobSeries();
  s.has_job = false;
}

void MetricsExporter::RunStarted(const std::string& slot, const v1::Job& job, absl::Duration queue_wait) {
  f_->queue_wait_all->Observe(absl::ToDoubleSeconds(queue_wait));
  absl::MutexLock lock(&mu_);
  SlotSeries& s = SlotLocked(slot);
  RemoveJobLocked(s);  // a run that never reported its stop
  const JobRef name = ParseStoredName(job.name());
  const prometheus::Labels l = {{"slot", slot}, {"job_id", name.id}, {"project", name.project}};
  prometheus::Labels info = l;
  info["model"] = ModelName(job.spec().model().path());
  s.job.id = name.id;
  s.job.labels = l;
  s.job.info = &f_->job_info.Add(info);
  s.job.info->Set(1);
  s.job.start_time = &f_->job_start_time.Add(l);
  s.job.start_time->Set(UnixSeconds(absl::Now()));
  s.job.step = &f_->job_step.Add(l);
  s.job.step->Set(static_cast<double>(job.progress().step()));
  s.job.total_steps = &f_->job_total_steps.Add(l);
  s.job.total_steps->Set(static_cast<double>(job.progress().total_steps()));
  const v1::Progress& p = job.progress();
  if (p.step() > 0) {  // a run that resumes: its last step's values until this run's first
    SetLastStepLocked(s.job, {.loss = p.loss(),
                              .learning_rate = p.learning_rate(),
                              .tokens_per_second = p.tokens_per_second(),
                              .eta_seconds = p.eta_seconds(),
                              .device_bytes = static_cast<double>(p.gpu_memory_bytes()),
                              .host_kv_bytes = static_cast<double>(p.host_memory_bytes())});
  }
  s.has_job = true;
  s.busy->Set(1);
}

void MetricsExporter::Step(const std::string& slot, const StepReport& p) {
  absl::MutexLock lock(&mu_);
  PruneEndedLocked(absl::Now());
  SlotSeries& s = SlotLocked(slot);
  s.tokens->Increment(static_cast<double>(p.step_tokens));
  s.steps->Increment();
  s.model_flops->Increment(p.model_flops);
  s.step_seconds->Observe(p.step_seconds);
  for (double t : p.forward_chunk_seconds) s.forward_chunk_seconds->Observe(t);
  for (double t : p.backward_chunk_seconds) s.backward_chunk_seconds->Observe(t);
  if (!s.has_job) return;
  JobSeries& j = s.job;
  j.step->Set(static_cast<double>(p.step));
  j.total_steps->Set(static_cast<double>(p.total_steps));
  SetLastStepLocked(j, {.loss = p.loss,
                        .learning_rate = p.learning_rate,
                        .tokens_per_second = p.tokens_per_second,
                        .eta_seconds = p.eta_seconds,
                        .device_bytes = static_cast<double>(p.peak_device_bytes),
                        .host_kv_bytes = static_cast<double>(p.host_kv_bytes),
                        .swapped_bytes = static_cast<double>(p.swapped_bytes),
                        .swapped_chunks = static_cast<double>(p.swapped_chunks)});
  const prometheus::Labels& l = j.labels;
  if (p.eval_loss > 0) {
    if (j.eval_loss == nullptr) j.eval_loss = &f_->job_eval_loss.Add(l);
    j.eval_loss->Set(p.eval_loss);
  }
  if (p.evaluation.has_value()) EvaluatedLocked(*p.evaluation, j);
  if (p.mfu > 0) {
    if (j.mfu == nullptr) j.mfu = &f_->job_mfu.Add(l);
    j.mfu->Set(p.mfu);
  }
  if (p.attention_density > 0) {
    if (j.attention_density == nullptr) j.attention_density = &f_->job_attention_density.Add(l);
    j.attention_density->Set(p.attention_density);
  }
  if (p.router_aux_loss > 0) {
    if (j.router_aux_loss == nullptr) j.router_aux_loss = &f_->job_router_aux_loss.Add(l);
    j.router_aux_loss->Set(p.router_aux_loss);
  }
}

void MetricsExporter::SetLastStepLocked(JobSeries& j, const LastStep& v) {
  const auto set = [&](Family<Gauge>& family, prometheus::Gauge*& g, double value) {
    if (g == nullptr) g = &family.Add(j.labels);
    g->Set(value);
  };
  set(f_->job_loss, j.loss, v.loss);
  set(f_->job_learning_rate, j.learning_rate, v.learning_rate);
  set(f_->job_tokens_per_second, j.tokens_per_second, v.tokens_per_second);
  set(f_->job_eta, j.eta, v.eta_seconds);
  set(f_->job_device_memory_peak, j.device_memory_peak, v.device_bytes);
  set(f_->job_host_kv, j.host_kv, v.host_kv_bytes);
  set(f_->job_swapped_bytes, j.swapped_bytes, v.swapped_bytes);
  set(f_->job_swapped_chunks, j.swapped_chunks, v.swapped_chunks);
}

void MetricsExporter::EvaluatedLocked(const EvalReport& e, JobSeries& j) {
  for (const auto& [suite, result] : e) {
    const std::string name = SuiteName(suite);
    if (const std::optional<double> accuracy = result.accuracy()) {
      prometheus::Gauge*& g = j.eval_accuracy[name];
      if (g == nullptr) {
        prometheus::Labels l = j.labels;
        l["suite"] = name;
        g = &f_->job_eval_accuracy.Add(l);
      }
      g->Set(*accuracy);
    }
    for (const PositionLoss& b : result.buckets) {
      const std::string begin = std::to_string(b.begin);
      prometheus::Gauge*& g = j.eval_position_loss[begin];
      if (g == nullptr) {
        prometheus::Labels l = j.labels;
        l["begin"] = begin;
        l["end"] = std::to_string(b.end);
        g = &f_->job_eval_position_loss.Add(l);
      }
      g->Set(b.loss);
    }
    if (!result.ruler.empty()) RulerLocked(result, j);
  }
}

void MetricsExporter::RulerLocked(const SuiteResult& r, JobSeries& j) {
  const auto gauge = [&](Family<Gauge>& family, prometheus::Gauge*& g, const prometheus::Labels& extra) {
    if (g != nullptr) return g;
    prometheus::Labels l = j.labels;
    l.insert(extra.begin(), extra.end());
    return g = &family.Add(l);
  };
  for (const RulerScore& s : r.ruler) {
    const std::string task = RulerTaskName(s.task), length = std::to_string(s.length);
    gauge(f_->job_eval_ruler_score, j.eval_ruler_score[task + "@" + length], {{"task", task}, {"length", length}})
        ->Set(s.score / 100);
  }
  for (const auto& [length, score] : r.averages()) {
    const std::string l = std::to_string(length);
    gauge(f_->job_eval_ruler_average, j.eval_ruler_average[l], {{"length", l}})->Set(score / 100);
  }
  gauge(f_->job_eval_ruler_effective_length, j.eval_ruler_effective_length, {})
      ->Set(static_cast<double>(r.effective_length().value_or(0)));
}

void MetricsExporter::CheckpointSaved(const std::string& slot, const CheckpointInfo& c) {
  absl::MutexLock lock(&mu_);
  SlotSeries& s = SlotLocked(slot);
  s.checkpoints->Increment();
  s.checkpoint_bytes->Increment(static_cast<double>(c.bytes));
  s.checkpoint_seconds->Observe(c.seconds);
}

void MetricsExporter::RunStopped(const std::string& slot) {
  absl::MutexLock lock(&mu_);
  SlotSeries& s = SlotLocked(slot);
  RemoveJobLocked(s);
  s.busy->Set(0);
}

void MetricsExporter::StateEntered(const v1::Job& job, v1::Job::State state) {
  f_->transitions.Add({{"state", v1::Job::State_Name(state)}}).Increment();
  const JobRef name = ParseStoredName(job.name());
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  PruneEndedLocked(now);
  bool ran_here = false;
  for (const auto& [slot, s] : slots_) ran_here |= s.has_job && s.job.id == name.id;
  const bool finished = state == v1::Job::SUCCEEDED || state == v1::Job::FAILED || state == v1::Job::CANCELLED;
  const bool run_ended = ran_here && (state == v1::Job::PAUSED || state == v1::Job::QUEUED);
  if (!finished && !run_ended) return;
  Ended& e = ended_[name.id];
  if (e.series != nullptr) f_->job_end_time.Remove(e.series);
  e.when = now;
  e.series = &f_->job_end_time.Add({{"job_id", name.id},
                                    {"project", name.project},
                                    {"state", v1::Job::State_Name(state)},
                                    {"reason", state == v1::Job::FAILED ? job.error().reason() : ""}});
  e.series->Set(UnixSeconds(now));
}

void MetricsExporter::PruneEndedLocked(absl::Time now) {
  for (auto it = ended_.begin(); it != ended_.end();) {
    if (now - it->second.when < kEndedKept) {
      ++it;
      continue;
    }
    f_->job_end_time.Remove(it->second.series);
    it = ended_.erase(it);
  }
}

void MetricsExporter::WebhookAttempt(const std::string& result) {
  f_->webhook_attempts.Add({{"result", result}}).Increment();
}

void MetricsExporter::RpcFinished(const std::string& full_method, int code, double seconds) {
  auto [service, method] = ServiceAndMethod(full_method);
  const prometheus::Labels l = {{"service", service}, {"method", method}, {"code", CodeName(code)}};
  f_->rpc_handled.Add(l).Increment();
  if (seconds >= 0) f_->rpc_seconds.Add(l, kRpcBuckets).Observe(seconds);
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MetricsExporter::NewInterceptorFactory() {
  return std::make_unique<RpcInterceptorFactory>(this);
}

std::string MetricsExporter::Scrape() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (prometheus::MetricFamily& f : collector_->Collect()) families.push_back(std::move(f));
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

}  // namespace oomb::server
