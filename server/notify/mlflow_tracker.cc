#include "server/notify/mlflow_tracker.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"
#include "server/notify/http_client.h"
#include "server/notify/remote_answers.h"
#include "server/scheduler.h"
#include "worker/common/status.h"
#include "worker/job/executor.h"

namespace oomb::server {
namespace {

constexpr size_t kMetricsPerBatch = 1000;  // MLflow's limits on one runs/log-batch
constexpr size_t kParamsPerBatch = 100;
constexpr size_t kParamValueBytes = 6000;

int64_t NowMillis() { return absl::ToUnixMillis(absl::Now()); }

// The run id of a Job.mlflow_run ("{uri}#/experiments/{e}/runs/{id}"); empty when none.
std::string RunIdOf(const std::string& link) {
  const size_t at = link.rfind("/runs/");
  return at == std::string::npos ? "" : link.substr(at + 6);
}

// MLflow's status of a run whose job ended in `state`.
std::string EndStatus(v1::Job::State state) {
  if (state == v1::Job::SUCCEEDED) return "FINISHED";
  if (state == v1::Job::FAILED) return "FAILED";
  return "KILLED";
}

void Flatten(const nlohmann::json& value, const std::string& prefix, std::map<std::string, std::string>* out) {
  if (value.is_object()) {
    for (const auto& [k, v] : value.items()) Flatten(v, prefix.empty() ? k : absl::StrCat(prefix, ".", k), out);
  } else if (value.is_string()) {
    (*out)[prefix] = value.get<std::string>().substr(0, kParamValueBytes);
  } else {
    (*out)[prefix] = value.dump().substr(0, kParamValueBytes);
  }
}

}  // namespace

// --- MlflowClient ---

MlflowClient::MlflowClient(std::string uri, std::string token, std::string ca_file, absl::Duration timeout,
                           DestinationPolicy destinations)
    : uri_(std::move(uri)),
      token_(std::move(token)),
      ca_file_(std::move(ca_file)),
      timeout_(timeout),
      destinations_(std::move(destinations)) {}

absl::StatusOr<nlohmann::json> MlflowClient::Call(const std::string& method, const std::string& path,
                                                  const nlohmann::json& body) {
  HttpRequest request{.method = method,
                      .url = absl::StrCat(absl::StripSuffix(uri_, "/"), "/api/2.0/mlflow/", path),
                      .headers = {"Content-Type: application/json"},
                      .body = method == "POST" ? body.dump() : "",
                      .timeout = timeout_,
                      .ca_file = ca_file_,
                      .destinations = destinations_};
  if (!token_.empty()) request.headers.push_back(absl::StrCat("Authorization: Bearer ", token_));
  OOMB_ASSIGN_OR_RETURN(const HttpResponse answer, SendHttp(request));
  return ParseMlflowAnswer(path, answer.status, answer.body);
}

absl::StatusOr<std::string> MlflowClient::Experiment(const std::string& name) {
  absl::StatusOr<nlohmann::json> found =
      Call("GET", absl::StrCat("experiments/get-by-name?experiment_name=", UrlEscape(name)), nullptr);
  if (found.ok()) return MlflowIdAt(*found, {"experiment", "experiment_id"}, "experiments/get-by-name");
  if (!absl::IsNotFound(found.status())) return found.status();
  OOMB_ASSIGN_OR_RETURN(const nlohmann::json made, Call("POST", "experiments/create", {{"name", name}}));
  return MlflowIdAt(made, {"experiment_id"}, "experiments/create");
}

absl::StatusOr<std::string> MlflowClient::CreateRun(const std::string& experiment_id, const std::string& run_name,
                                                    const std::map<std::string, std::string>& tags) {
  nlohmann::json t = nlohmann::json::array();
  for (const auto& [k, v] : tags) t.push_back({{"key", k}, {"value", v}});
  OOMB_ASSIGN_OR_RETURN(
      const nlohmann::json made,
      Call("POST", "runs/create",
           {{"experiment_id", experiment_id}, {"run_name", run_name}, {"start_time", NowMillis()}, {"tags", t}}));
  return MlflowIdAt(made, {"run", "info", "run_id"}, "runs/create");
}

absl::Status MlflowClient::LogBatch(const std::string& run_id, const nlohmann::json& metrics,
                                    const nlohmann::json& params, const nlohmann::json& tags) {
  return Call("POST", "runs/log-batch", {{"run_id", run_id}, {"metrics", metrics}, {"params", params}, {"tags", tags}})
      .status();
}

absl::Status MlflowClient::EndRun(const std::string& run_id, const std::string& status) {
  return Call("POST", "runs/update", {{"run_id", run_id}, {"status", status}, {"end_time", NowMillis()}}).status();
}

// --- MlflowTracker ---

MlflowTracker::MlflowTracker(JobStore* store, MlflowTrackerOptions options)
    : store_(store), options_(std::move(options)) {}

MlflowTracker::~MlflowTracker() { Stop(); }

void MlflowTracker::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void MlflowTracker::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void MlflowTracker::Loop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.flush_every)) break;
    }
    Flush();
  }
  Flush();  // what the last steps left
}

std::string MlflowTracker::UriOf(const v1::Job& job) const {
  const std::string& uri = job.spec().tracking().mlflow().uri();
  return uri.empty() ? options_.default_uri : uri;
}

void MlflowTracker::RunStarted(const std::string& slot, const v1::Job& job, absl::Duration) {
  const std::string uri = UriOf(job);
  if (uri.empty()) return;
  const std::string id = ParseStoredName(job.name()).id;
  absl::MutexLock lock(&mu_);
  slots_[slot] = id;
  Run& run = runs_[id];
  run.job = job;
  run.uri = uri;
  run.operators = job.spec().tracking().mlflow().uri().empty() || SameServer(uri, options_.default_uri);
  run.stopped = false;
  if (run.run_id.empty()) run.run_id = RunIdOf(job.mlflow_run());
}

void MlflowTracker::Step(const std::string& slot, const StepReport& progress) {
  absl::MutexLock lock(&mu_);
  const auto s = slots_.find(slot);
  if (s == slots_.end()) return;
  Run& run = runs_[s->second];
  if (run.refused) return;
  for (nlohmann::json& m : StepMetrics(progress, NowMillis())) run.metrics.push_back(std::move(m));
  if (run.metrics.size() > options_.max_buffered) {
    const size_t drop = run.metrics.size() - options_.max_buffered;
    run.metrics.erase(run.metrics.begin(), run.metrics.begin() + static_cast<std::ptrdiff_t>(drop));
    spdlog::warn("mlflow: {}: the tracking server is away; dropped the oldest {} buffered metrics", s->second, drop);
  }
}

void MlflowTracker::CheckpointSaved(const std::string& slot, const CheckpointInfo& checkpoint) {
  if (!checkpoint.final) return;
  absl::MutexLock lock(&mu_);
  const auto s = slots_.find(slot);
  if (s != slots_.end()) runs_[s->second].final_checkpoint = checkpoint.path;
}

void MlflowTracker::RunStopped(const std::string& slot) {
  absl::MutexLock lock(&mu_);
  const auto s = slots_.find(slot);
  if (s == slots_.end()) return;
  runs_[s->second].stopped = true;
  slots_.erase(s);
}

void MlflowTracker::Flush() {
  absl::MutexLock flushing(&flush_mu_);
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, run] : runs_) ids.push_back(id);
  }
  for (const std::string& id : ids) {
    Run run;
    {  // the buffer is taken out, so steps go on appending meanwhile
      absl::MutexLock lock(&mu_);
      Run& live = runs_[id];
      run.job = live.job;
      run.uri = live.uri;
      run.operators = live.operators;
      run.refused = live.refused;
      run.run_id = live.run_id;
      run.final_checkpoint = live.final_checkpoint;
      run.params_sent = live.params_sent;
      run.stopped = live.stopped;
      run.warned = live.warned;
      run.metrics.swap(live.metrics);
    }
    const bool keep = FlushOne(id, &run);
    absl::MutexLock lock(&mu_);
    Run& live = runs_[id];
    live.metrics.insert(live.metrics.begin(), std::make_move_iterator(run.metrics.begin()),
                        std::make_move_iterator(run.metrics.end()));  // unsent, before the newer ones
    live.run_id = run.run_id;
    live.params_sent = run.params_sent;
    live.warned = run.warned;
    live.refused = run.refused;
    if (live.refused) live.metrics.clear();
    if (!keep && live.metrics.empty() && live.stopped) runs_.erase(id);
  }
}

absl::StatusOr<MlflowClient> MlflowTracker::ClientOf(const Run& run) const {
  const std::string project = ParseStoredName(run.job.name()).project;
  std::string token = run.operators ? options_.token : "";
  if (const std::string& secret = run.job.spec().tracking().mlflow().token_secret(); !secret.empty()) {
    if (!options_.secret) {
      return absl::FailedPreconditionError("tracking.mlflow.token_secret: this daemon resolves no secrets");
    }
    OOMB_ASSIGN_OR_RETURN(token, options_.secret(project, secret));
  }
  if (run.operators) {
    return MlflowClient(run.uri, token, options_.ca_file, options_.request_timeout, DestinationPolicy::Unrestricted());
  }
  return MlflowClient(run.uri, token, options_.ca_file, options_.request_timeout,
                      options_.destinations ? options_.destinations(project) : DestinationPolicy());
}

absl::Status MlflowTracker::EnsureRun(const std::string& job_id, Run* run) {
  OOMB_ASSIGN_OR_RETURN(MlflowClient client, ClientOf(*run));
  if (run->run_id.empty()) {
    const v1::MlflowSpec& spec = run->job.spec().tracking().mlflow();
    const std::string project = ParseStoredName(run->job.name()).project;
    OOMB_ASSIGN_OR_RETURN(
        const std::string experiment,
        client.Experiment(spec.experiment().empty() ? absl::StrCat("oomb/", project) : spec.experiment()));
    OOMB_ASSIGN_OR_RETURN(run->run_id, client.CreateRun(experiment, spec.run_name().empty() ? job_id : spec.run_name(),
                                                        {{"oomb.job", run->job.name()},
                                                         {"oomb.project", project},
                                                         {"oomb.version", options_.version},
                                                         {"mlflow.source.name", "oombd"}}));
    const std::string link =
        absl::StrCat(absl::StripSuffix(run->uri, "/"), "/#/experiments/", experiment, "/runs/", run->run_id);
    absl::StatusOr<UpdateResult> recorded = store_->Update(job_id, [&](v1::Job* j, std::vector<v1::JobEvent>* events) {
      j->set_mlflow_run(link);
      v1::JobEvent e;
      e.set_type(v1::JobEvent::LOG);
      e.set_message(absl::StrCat("tracking: MLflow run ", link));
      events->push_back(std::move(e));
      return absl::OkStatus();
    });
    if (!recorded.ok()) spdlog::warn("mlflow: {}: recording its run: {}", job_id, recorded.status().ToString());
  }
  if (!run->params_sent) {
    const std::map<std::string, std::string> params = SpecParams(run->job.spec());
    nlohmann::json batch = nlohmann::json::array();
    for (const auto& [k, v] : params) {
      batch.push_back({{"key", k}, {"value", v}});
      if (batch.size() == kParamsPerBatch) {
        OOMB_RETURN_IF_ERROR(client.LogBatch(run->run_id, nlohmann::json::array(), batch, nlohmann::json::array()));
        batch = nlohmann::json::array();
      }
    }
    if (!batch.empty()) {
      OOMB_RETURN_IF_ERROR(client.LogBatch(run->run_id, nlohmann::json::array(), batch, nlohmann::json::array()));
    }
    run->params_sent = true;
  }
  return absl::OkStatus();
}

bool MlflowTracker::FlushOne(const std::string& job_id, Run* run) {
  if (run->refused) {
    run->metrics.clear();
    return false;
  }
  absl::StatusOr<MlflowClient> made = ClientOf(*run);
  absl::Status s = made.ok() ? EnsureRun(job_id, run) : made.status();
  std::optional<MlflowClient> client;
  if (made.ok()) client.emplace(*std::move(made));
  while (s.ok() && !run->metrics.empty()) {
    const size_t n = std::min(run->metrics.size(), kMetricsPerBatch);
    nlohmann::json batch = nlohmann::json::array();
    for (size_t i = 0; i < n; ++i) batch.push_back(run->metrics[i]);
    s = client->LogBatch(run->run_id, batch, nlohmann::json::array(), nlohmann::json::array());
    if (s.ok()) run->metrics.erase(run->metrics.begin(), run->metrics.begin() + static_cast<std::ptrdiff_t>(n));
  }
  bool keep = true;
  if (s.ok() && run->stopped) {
    absl::StatusOr<v1::Job> job = store_->Get(job_id);
    if (!job.ok() || IsTerminal(job->state())) {
      nlohmann::json tags = nlohmann::json::array();
      if (!run->final_checkpoint.empty())
        tags.push_back({{"key", "oomb.final_checkpoint"}, {"value", run->final_checkpoint}});
      s = client->LogBatch(run->run_id, nlohmann::json::array(), nlohmann::json::array(), tags);
      if (s.ok()) s = client->EndRun(run->run_id, job.ok() ? EndStatus(job->state()) : "KILLED");
      keep = !s.ok();
    } else if (job->state() != v1::Job::RUNNING && job->state() != v1::Job::PAUSING &&
               job->state() != v1::Job::CANCELLING) {
      keep = false;  // paused or queued again: its run stays RUNNING until it resumes
    }
  }
  if (absl::IsPermissionDenied(s)) {  // the destination policy's: no retry will pass it
    spdlog::warn("mlflow: {}: {}; not tracked", job_id, s.ToString());
    WarnJob(job_id,
            absl::StrCat("tracking: MLflow at ", run->uri, " refused: ", s.message(), "; this run is not tracked"));
    run->refused = true;
    run->metrics.clear();
    return false;
  }
  if (!s.ok() && !run->warned) {
    spdlog::warn("mlflow: {}: {} (kept; sent again later)", job_id, s.ToString());
    WarnJob(job_id, absl::StrCat("tracking: MLflow at ", run->uri, ": ", s.message(), " (kept; sent again later)"));
    run->warned = true;
  } else if (s.ok() && run->warned) {
    spdlog::info("mlflow: {}: the tracking server answers again", job_id);
    run->warned = false;
  }
  return keep;
}

void MlflowTracker::WarnJob(const std::string& job_id, const std::string& message) {
  absl::StatusOr<UpdateResult> recorded = store_->Update(job_id, [&](v1::Job*, std::vector<v1::JobEvent>* events) {
    v1::JobEvent e;
    e.set_type(v1::JobEvent::WARNING);
    e.set_message(BoundedText(message));
    events->push_back(std::move(e));
    return absl::OkStatus();
  });
  if (!recorded.ok()) spdlog::warn("mlflow: {}: recording a warning: {}", job_id, recorded.status().ToString());
}

std::map<std::string, std::string> MlflowTracker::SpecParams(const v1::JobSpec& spec) {
  std::string text;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  std::map<std::string, std::string> out;
  if (!google::protobuf::util::MessageToJsonString(spec, &text, o).ok()) return out;
  Flatten(nlohmann::json::parse(text, nullptr, false), "", &out);
  return out;
}

nlohmann::json MlflowTracker::StepMetrics(const StepReport& p, int64_t timestamp_ms) {
  nlohmann::json out = nlohmann::json::array();
  auto add = [&](const std::string& key, double value) {
    out.push_back({{"key", key}, {"value", value}, {"timestamp", timestamp_ms}, {"step", p.step}});
  };
  add("loss", p.loss);
  add("learning_rate", p.learning_rate);
  add("tokens_per_second", p.tokens_per_second);
  add("step_seconds", p.step_seconds);
  add("tokens", static_cast<double>(p.tokens));
  add("peak_device_bytes", static_cast<double>(p.peak_device_bytes));
  add("host_kv_bytes", static_cast<double>(p.host_kv_bytes));
  add("pcie_h2d_bytes", static_cast<double>(p.pcie_h2d_bytes));
  add("pcie_d2h_bytes", static_cast<double>(p.pcie_d2h_bytes));
  if (p.mfu > 0) add("mfu", p.mfu);
  if (p.router_aux_loss > 0) add("router_aux_loss", p.router_aux_loss);
  if (p.eval_loss > 0) add("eval_loss", p.eval_loss);
  if (p.evaluation.has_value()) {
    for (const auto& [suite, result] : *p.evaluation) {
      if (std::optional<double> a = result.accuracy(); a.has_value()) {
        add(absl::StrCat("eval.", SuiteName(suite), ".accuracy"), *a);
      }
      for (const PositionLoss& b : result.buckets) {
        add(absl::StrCat("eval.", SuiteName(suite), ".loss.", b.begin, "-", b.end), b.loss);
      }
    }
  }
  return out;
}

}  // namespace oomb::server
