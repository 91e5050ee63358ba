// The metrics exporter without LibTorch: what the scheduler's reports and the scrape-time
// sources turn into in the exposition text, per-job series going away with their run, bounded
// gRPC labels, the HTTP endpoint on port 0, and the scheduler calling its MetricsSink.
#include "server/metrics/exporter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "server/scheduler.h"
#include "server/store/job_store.h"
#include "server/watch_hub.h"
#include "tests/server/http_get.h"
#include "tests/server/submit.h"

namespace oomb::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The value of the sample line `series` (name and labels exactly as printed), or NaN.
double Sample(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return std::nan("");
  return std::stod(text.substr(at + series.size() + 2));
}

v1::Job RunningJob(const std::string& id, int64_t total_steps) {
  v1::Job job;
  job.set_name("projects/nlp/jobs/" + id);
  job.mutable_spec()->mutable_model()->set_path("/models/SmolLM2-135M-Instruct/");
  job.mutable_progress()->set_total_steps(total_steps);
  return job;
}

MetricsExporterOptions Options() {
  MetricsExporterOptions o;
  o.slots = {"cpu", "cuda:0"};
  o.build.version = "0.1.0";
  o.build.git_sha = "0123456789ab";
  o.build.torch_version = "2.11.0";
  o.build.cuda_version = "13.0";
  o.nvml = false;
  return o;
}

TEST(MetricsExporterTest, BuildInfoAndSlotSeriesExistFromTheStart) {
  auto e = MetricsExporter::Start(Options());
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->port(), 0);  // no listen: no HTTP server
  const std::string text = (*e)->Scrape();
  EXPECT_EQ(Sample(text, R"(oomb_build_info{cuda="13.0",git_sha="0123456789ab",torch="2.11.0",version="0.1.0"})"), 1);
  for (const char* slot : {"cpu", "cuda:0"}) {
    const std::string s = std::string("{slot=\"") + slot + "\"}";
    EXPECT_EQ(Sample(text, "oomb_tokens_total" + s), 0) << slot;
    EXPECT_EQ(Sample(text, "oomb_slot_busy" + s), 0) << slot;
    EXPECT_EQ(Sample(text, "oomb_step_duration_seconds_count" + s), 0) << slot;
  }
  EXPECT_EQ(Sample(text, R"(oomb_job_transitions_total{state="FAILED"})"), 0);  // pre-created for increase()
  EXPECT_GT(Sample(text, "oomb_start_time_seconds"), 1.7e9);
  EXPECT_THAT(text, Not(HasSubstr("oomb_job_info{")));
  // Scrape-time families without a source are absent, not zero.
  EXPECT_THAT(text, Not(HasSubstr("oomb_jobs{")));
  EXPECT_THAT(text, Not(HasSubstr("oomb_kv_pages")));
}

// Two steps of job-a on slot cpu: the second with an evaluation, MFU, swapped attention and
// memory peaks.
void TwoSteps(MetricsExporter& m) {
  StepReport p;
  p.step = 1;
  p.total_steps = 10;
  p.tokens = 128;
  p.step_tokens = 128;
  p.loss = 2.5;
  p.learning_rate = 1e-4;
  p.step_seconds = 0.2;
  p.tokens_per_second = 640;
  p.eta_seconds = 1.8;
  p.model_flops = 1e9;
  p.forward_chunk_seconds = {0.01, 0.02};
  p.backward_chunk_seconds = {0.05, 0.06};
  m.Step("cpu", p);
  p.step = 2;
  p.tokens = 256;
  p.loss = 2.25;
  p.eval_loss = 2.4;
  p.mfu = 0.42;
  p.router_aux_loss = 2.125;
  p.swapped_bytes = 7168;
  p.swapped_chunks = 3;
  p.peak_device_bytes = 5'000'000;
  p.host_kv_bytes = 3'000'000;
  p.evaluation = EvalReport{
      {EvalSuite::kPositions, {.buckets = {{0, 1024, 2.5, 1000, 300}, {1024, 2048, 2.25, 500, 160}}, .cells = {}}},
      {EvalSuite::kPasskey, {.buckets = {}, .cells = {{.length = 4096, .depth = 0, .correct = 3, .trials = 4}}}},
      {EvalSuite::kRuler,
       {.buckets = {},
        .cells = {},
        .ruler = {{RulerTask::kVt, 4096, 90, 10},
                  {RulerTask::kCwe, 4096, 100, 10},
                  {RulerTask::kVt, 8192, 50, 10},
                  {RulerTask::kCwe, 8192, 70, 10}}}}};
  m.Step("cpu", p);
}

// The ruler suite: a score by task and length, the average by length and the effective length,
// gone with the run.
TEST(MetricsExporterTest, RulerScoresByTaskAndLengthAndTheEffectiveLength) {
  auto e = MetricsExporter::Start(Options());
  ASSERT_TRUE(e.ok()) << e.status();
  MetricsExporter& m = **e;
  m.RunStarted("cpu", RunningJob("job-a", 10), absl::Seconds(3));
  TwoSteps(m);
  std::string text = m.Scrape();
  EXPECT_THAT(text, Not(HasSubstr(R"(suite="ruler")")));  // no accuracy: scores by task and length
  EXPECT_EQ(Sample(text, R"(oomb_job_eval_ruler_score_ratio{job_id="job-a",length="8192",project="nlp",slot="cpu",)"
                         R"(task="cwe"})"),
            0.7);
  EXPECT_EQ(Sample(text, R"(oomb_job_eval_ruler_average_ratio{job_id="job-a",length="4096",project="nlp",slot="cpu"})"),
            0.95);
  EXPECT_EQ(Sample(text, R"(oomb_job_eval_ruler_effective_length_tokens{job_id="job-a",project="nlp",slot="cpu"})"),
            4096);  // 8192's average, 60, is below 85.6
  m.RunStopped("cpu");
  text = m.Scrape();
  for (const char* gone : {"oomb_job_eval_ruler_score_ratio{", "oomb_job_eval_ruler_average_ratio{",
                           "oomb_job_eval_ruler_effective_length_tokens{"}) {
    EXPECT_THAT(text, Not(HasSubstr(gone)));
  }
}

TEST(MetricsExporterTest, PerJobSeriesLiveWhileTheRunDoesAndCountersStay) {
  auto e = MetricsExporter::Start(Options());
  ASSERT_TRUE(e.ok()) << e.status();
  MetricsExporter& m = **e;
  m.RunStarted("cpu", RunningJob("job-a", 10), absl::Seconds(3));
  TwoSteps(m);
  m.CheckpointSaved("cpu", CheckpointInfo{.step = 2, .path = "/c", .bytes = 1000, .final = false, .seconds = 0.3});

  std::string text = m.Scrape();
  EXPECT_EQ(Sample(text, R"(oomb_job_info{job_id="job-a",model="SmolLM2-135M-Instruct",project="nlp",slot="cpu"})"), 1);
  EXPECT_EQ(Sample(text, R"(oomb_job_step{job_id="job-a",project="nlp",slot="cpu"})"), 2);
  EXPECT_EQ(Sample(text, R"(oomb_job_total_steps{job_id="job-a",project="nlp",slot="cpu"})"), 10);
  EXPECT_EQ(Sample(text, R"(oomb_job_loss{job_id="job-a",project="nlp",slot="cpu"})"), 2.25);
  EXPECT_EQ(Sample(text, R"(oomb_job_eval_loss{job_id="job-a",project="nlp",slot="cpu"})"), 2.4);
  EXPECT_EQ(Sample(text, R"(oomb_job_mfu_ratio{job_id="job-a",project="nlp",slot="cpu"})"), 0.42);
  EXPECT_EQ(Sample(text, R"(oomb_job_router_aux_loss{job_id="job-a",project="nlp",slot="cpu"})"), 2.125);
  EXPECT_EQ(Sample(text, R"(oomb_job_eval_accuracy_ratio{job_id="job-a",project="nlp",slot="cpu",suite="passkey"})"),
            0.75);
  EXPECT_THAT(text, Not(HasSubstr(R"(suite="needle")")));  // not run
  EXPECT_EQ(
      Sample(text, R"(oomb_job_eval_position_loss{begin="1024",end="2048",job_id="job-a",project="nlp",slot="cpu"})"),
      2.25);
  EXPECT_EQ(Sample(text, R"(oomb_job_device_memory_peak_bytes{job_id="job-a",project="nlp",slot="cpu"})"), 5e6);
  EXPECT_EQ(Sample(text, R"(oomb_job_host_kv_bytes{job_id="job-a",project="nlp",slot="cpu"})"), 3e6);
  EXPECT_GT(Sample(text, R"(oomb_job_start_time_seconds{job_id="job-a",project="nlp",slot="cpu"})"), 1.7e9);
  EXPECT_EQ(Sample(text, R"(oomb_job_eta_seconds{job_id="job-a",project="nlp",slot="cpu"})"), 1.8);
  EXPECT_EQ(Sample(text, R"(oomb_job_swapped_bytes{job_id="job-a",project="nlp",slot="cpu"})"), 7168);
  EXPECT_EQ(Sample(text, R"(oomb_job_swapped_chunks{job_id="job-a",project="nlp",slot="cpu"})"), 3);
  EXPECT_EQ(Sample(text, R"(oomb_slot_busy{slot="cpu"})"), 1);
  EXPECT_EQ(Sample(text, R"(oomb_tokens_total{slot="cpu"})"), 256);
  EXPECT_EQ(Sample(text, R"(oomb_steps_total{slot="cpu"})"), 2);
  EXPECT_EQ(Sample(text, R"(oomb_model_flops_total{slot="cpu"})"), 2e9);
  EXPECT_EQ(Sample(text, R"(oomb_chunk_duration_seconds_count{slot="cpu",stage="forward"})"), 4);
  EXPECT_EQ(Sample(text, R"(oomb_chunk_duration_seconds_count{slot="cpu",stage="backward"})"), 4);
  EXPECT_EQ(Sample(text, R"(oomb_chunk_duration_seconds_bucket{slot="cpu",stage="backward",le="0.05"})"), 2);
  EXPECT_EQ(Sample(text, R"(oomb_step_duration_seconds_bucket{slot="cpu",le="0.25"})"), 2);
  EXPECT_EQ(Sample(text, R"(oomb_checkpoints_total{slot="cpu"})"), 1);
  EXPECT_EQ(Sample(text, R"(oomb_checkpoint_bytes_total{slot="cpu"})"), 1000);
  EXPECT_EQ(Sample(text, R"(oomb_checkpoint_duration_seconds_sum{slot="cpu"})"), 0.3);
  EXPECT_EQ(Sample(text, "oomb_queue_wait_seconds_count"), 1);
  EXPECT_EQ(Sample(text, "oomb_queue_wait_seconds_sum"), 3);
  EXPECT_EQ(Sample(text, R"(oomb_tokens_total{slot="cuda:0"})"), 0);

  m.RunStopped("cpu");
  text = m.Scrape();
  for (const char* gone : {"oomb_job_info{",
                           "oomb_job_step{",
                           "oomb_job_total_steps{",
                           "oomb_job_loss{",
                           "oomb_job_eval_loss{",
                           "oomb_job_eval_accuracy_ratio{",
                           "oomb_job_eval_position_loss{",
                           "oomb_job_mfu_ratio{",
                           "oomb_job_eta_seconds{",
                           "oomb_job_router_aux_loss{",
                           "oomb_job_learning_rate{",
                           "oomb_job_tokens_per_second{",
                           "oomb_job_swapped_bytes{",
                           "oomb_job_swapped_chunks{",
                           "oomb_job_start_time_seconds{",
                           "oomb_job_device_memory_peak_bytes{",
                           "oomb_job_host_kv_bytes{",
                           "oomb_job_eval_ruler_score_ratio{",
                           "oomb_job_eval_ruler_average_ratio{",
                           "oomb_job_eval_ruler_effective_length_tokens{"}) {
    EXPECT_THAT(text, Not(HasSubstr(gone)));
  }
  EXPECT_EQ(Sample(text, R"(oomb_slot_busy{slot="cpu"})"), 0);
  EXPECT_EQ(Sample(text, R"(oomb_tokens_total{slot="cpu"})"), 256);  // slot counters outlive the job

  // The next job on the slot gets fresh per-job series; no MFU until a step reports one.
  m.RunStarted("cpu", RunningJob("job-b", 5), absl::ZeroDuration());
  text = m.Scrape();
  EXPECT_EQ(Sample(text, R"(oomb_job_info{job_id="job-b",model="SmolLM2-135M-Instruct",project="nlp",slot="cpu"})"), 1);
  EXPECT_THAT(text, Not(HasSubstr("job-a")));
  EXPECT_THAT(text, Not(HasSubstr("oomb_job_mfu_ratio{")));
  EXPECT_THAT(text, Not(HasSubstr("oomb_job_router_aux_loss{")));
}

TEST(MetricsExporterTest, StateTransitionsAndRpcLabelsAreBounded) {
  auto e = MetricsExporter::Start(Options());
  ASSERT_TRUE(e.ok()) << e.status();
  MetricsExporter& m = **e;
  m.StateEntered(RunningJob("job-a", 1), v1::Job::QUEUED);
  m.StateEntered(RunningJob("job-b", 1), v1::Job::QUEUED);
  m.StateEntered(RunningJob("job-a", 1), v1::Job::FAILED);
  m.RpcFinished("/oomb.v1.JobService/GetJob", 5, 0.002);
  m.RpcFinished("/oomb.v1.JobService/GetJob", 0, 0.001);
  m.RpcFinished("/oomb.v1.JobService/WatchJob", 1, -1);  // a stream: counted, not timed
  m.RpcFinished("/evil.Service/Method123", 12, 0.001);
  m.RpcFinished("/oomb.v1.JobService/NoSuchMethod", 12, 0.001);
  m.RpcFinished("/grpc.health.v1.Health/Check", 0, 0.0001);
  const std::string text = m.Scrape();
  EXPECT_EQ(Sample(text, R"(oomb_job_transitions_total{state="QUEUED"})"), 2);
  EXPECT_EQ(Sample(text, R"(oomb_job_transitions_total{state="FAILED"})"), 1);
  EXPECT_EQ(
      Sample(text, R"(oomb_grpc_server_handled_total{code="NOT_FOUND",method="GetJob",service="oomb.v1.JobService"})"),
      1);
  EXPECT_EQ(Sample(text, R"(oomb_grpc_server_handled_total{code="OK",method="GetJob",service="oomb.v1.JobService"})"),
            1);
  EXPECT_EQ(
      Sample(text,
             R"(oomb_grpc_server_handled_total{code="CANCELLED",method="WatchJob",service="oomb.v1.JobService"})"),
      1);
  EXPECT_THAT(text, Not(HasSubstr(R"(oomb_grpc_server_handling_seconds_count{code="CANCELLED",method="WatchJob")")));
  EXPECT_EQ(
      Sample(
          text,
          R"(oomb_grpc_server_handling_seconds_count{code="NOT_FOUND",method="GetJob",service="oomb.v1.JobService"})"),
      1);
  EXPECT_EQ(Sample(text, R"(oomb_grpc_server_handled_total{code="UNIMPLEMENTED",method="unknown",service="unknown"})"),
            2);
  EXPECT_EQ(Sample(text, R"(oomb_grpc_server_handled_total{code="OK",method="Check",service="grpc.health.v1.Health"})"),
            1);
  EXPECT_THAT(text, Not(HasSubstr("evil")));
  EXPECT_THAT(text, Not(HasSubstr("NoSuchMethod")));
}

// oomb_job_end_time_seconds: a job's run that ended here (paused, preempted back to the queue,
// or finished) and any job that reached a final state here, one series per job (its latest end),
// FAILED with the error's reason; entering the queue without having run here is no end.
TEST(MetricsExporterTest, JobEndsAreNamedWithTheirStateAndReason) {
  auto e = MetricsExporter::Start(Options());
  ASSERT_TRUE(e.ok()) << e.status();
  MetricsExporter& m = **e;
  m.StateEntered(RunningJob("job-a", 1), v1::Job::QUEUED);  // submitted
  EXPECT_THAT(m.Scrape(), Not(HasSubstr("oomb_job_end_time_seconds{")));
  m.RunStarted("cpu", RunningJob("job-a", 1), absl::ZeroDuration());
  m.StateEntered(RunningJob("job-a", 1), v1::Job::PAUSED);
  m.RunStopped("cpu");
  std::string text = m.Scrape();
  EXPECT_GT(Sample(text, R"(oomb_job_end_time_seconds{job_id="job-a",project="nlp",reason="",state="PAUSED"})"), 1.7e9);
  m.StateEntered(RunningJob("job-a", 1), v1::Job::QUEUED);  // resumed: waits, has not run here
  m.RunStarted("cpu", RunningJob("job-a", 1), absl::ZeroDuration());
  v1::Job failed = RunningJob("job-a", 1);
  failed.mutable_error()->set_reason("NAN_LOSS");
  m.StateEntered(failed, v1::Job::FAILED);
  m.RunStopped("cpu");
  m.StateEntered(RunningJob("job-b", 1), v1::Job::CANCELLED);  // cancelled while queued
  text = m.Scrape();
  EXPECT_THAT(text, Not(HasSubstr(R"(reason="",state="PAUSED")")));  // the latest end only
  EXPECT_GT(Sample(text, R"(oomb_job_end_time_seconds{job_id="job-a",project="nlp",reason="NAN_LOSS",state="FAILED"})"),
            1.7e9);
  EXPECT_GT(Sample(text, R"(oomb_job_end_time_seconds{job_id="job-b",project="nlp",reason="",state="CANCELLED"})"),
            1.7e9);
}

TEST(MetricsExporterTest, ScrapeTimeSourcesAreReadAtEveryScrape) {
  KvStatsRegistry kv;
  int scrapes = 0;
  MetricsExporterOptions o = Options();
  o.kv_stats = &kv;
  o.count_jobs = [&]() -> absl::StatusOr<std::map<v1::Job::State, int64_t>> {
    return std::map<v1::Job::State, int64_t>{{v1::Job::QUEUED, 2}, {v1::Job::SUCCEEDED, ++scrapes}};
  };
  o.device_memory = [] {
    DeviceMemoryStats d;
    d.index = 0;
    d.uuid = "GPU-8c6e5a8e-0000-1111-2222-333344445555";
    d.allocated_bytes = 1000;
    d.reserved_bytes = 2000;
    d.peak_allocated_bytes = 1500;
    d.alloc_retries = 3;
    d.ooms = 1;
    return std::vector<DeviceMemoryStats>{d};
  };
  o.pinned_host_bytes = [] { return int64_t{4096}; };
  auto e = MetricsExporter::Start(o);
  ASSERT_TRUE(e.ok()) << e.status();
  std::shared_ptr<PoolCounters> pool = kv.AddPool("cuda:0", Tier::kDevice, PageKind::kKv, 10, 100);
  pool->Set(4, 6);
  kv.RecordTransfer("cuda:0", TransferDirection::kHostToDevice, PageKind::kKvGrad, 512, 1e-5);

  std::string text = (*e)->Scrape();
  EXPECT_EQ(Sample(text, R"(oomb_jobs{state="QUEUED"})"), 2);
  EXPECT_EQ(Sample(text, R"(oomb_jobs{state="SUCCEEDED"})"), 1);
  EXPECT_EQ(Sample(text, R"(oomb_jobs{state="PAUSED"})"), 0);  // every state, 0 when none
  const std::string gpu = R"({gpu="0",UUID="GPU-8c6e5a8e-0000-1111-2222-333344445555"})";
  EXPECT_EQ(Sample(text, "oomb_gpu_memory_allocated_bytes" + gpu), 1000);
  EXPECT_EQ(Sample(text, "oomb_gpu_memory_reserved_bytes" + gpu), 2000);
  EXPECT_EQ(Sample(text, "oomb_gpu_memory_peak_bytes" + gpu), 1500);
  EXPECT_EQ(Sample(text, "oomb_gpu_allocator_retries_total" + gpu), 3);
  EXPECT_EQ(Sample(text, "oomb_gpu_allocator_ooms_total" + gpu), 1);
  EXPECT_THAT(text, Not(HasSubstr("oomb_gpu_memory_used_bytes{")));  // NVML is off here
  EXPECT_EQ(Sample(text, "oomb_host_pinned_bytes"), 4096);
  EXPECT_EQ(Sample(text, R"(oomb_kv_pages{slot="cuda:0",tier="gpu",kind="kv",state="used"})"), 4);
  EXPECT_EQ(Sample(text, R"(oomb_kv_pages{slot="cuda:0",tier="gpu",kind="kv",state="free"})"), 6);
  EXPECT_EQ(Sample(text, R"(oomb_kv_bytes{slot="cuda:0",tier="gpu",kind="kv"})"), 400);
  EXPECT_EQ(Sample(text, R"(oomb_kv_capacity_bytes{slot="cuda:0",tier="gpu",kind="kv"})"), 1000);
  EXPECT_EQ(Sample(text, R"(oomb_kv_peak_bytes{slot="cuda:0",tier="gpu",kind="kv"})"), 600);
  // The host tier exists in the exposition, at zero (there is no host tier yet).
  EXPECT_EQ(Sample(text, R"(oomb_kv_bytes{slot="cuda:0",tier="host",kind="kv"})"), 0);
  EXPECT_EQ(Sample(text, R"(oomb_kv_capacity_bytes{slot="cpu",tier="host",kind="kv_grad"})"), 0);
  EXPECT_EQ(Sample(text, R"(oomb_pcie_transfer_bytes_total{slot="cuda:0",direction="h2d",kind="kv_grad"})"), 512);
  EXPECT_EQ(Sample(text, R"(oomb_pcie_transfer_bytes_total{slot="cuda:0",direction="d2h",kind="kv"})"), 0);
  EXPECT_EQ(
      Sample(text,
             R"(oomb_pcie_transfer_duration_seconds_bucket{slot="cuda:0",direction="h2d",kind="kv_grad",le="2e-05"})"),
      1);
  EXPECT_EQ(
      Sample(text,
             R"(oomb_pcie_transfer_duration_seconds_bucket{slot="cuda:0",direction="h2d",kind="kv_grad",le="+Inf"})"),
      1);

  pool->Set(0, 6);
  text = (*e)->Scrape();
  EXPECT_EQ(Sample(text, R"(oomb_jobs{state="SUCCEEDED"})"), 2);  // read again
  EXPECT_EQ(Sample(text, R"(oomb_kv_pages{slot="cuda:0",tier="gpu",kind="kv",state="used"})"), 0);
  pool.reset();  // the job ended: its arena is gone
  text = (*e)->Scrape();
  EXPECT_EQ(Sample(text, R"(oomb_kv_capacity_bytes{slot="cuda:0",tier="gpu",kind="kv"})"), 0);
}

TEST(MetricsExporterTest, ServesMetricsOverHttpOnAnyFreePort) {
  MetricsExporterOptions o = Options();
  o.listen = "127.0.0.1:0";
  auto e = MetricsExporter::Start(o);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_GT((*e)->port(), 0);
  const testing::HttpResponse response = testing::HttpGet((*e)->port(), "/metrics");
  EXPECT_EQ(response.status, 200);
  EXPECT_THAT(response.body, HasSubstr("# TYPE oomb_tokens_total counter"));
  EXPECT_THAT(response.body, HasSubstr("oomb_build_info{"));

  // The same address again: taken.
  MetricsExporterOptions again = Options();
  again.listen = "127.0.0.1:" + std::to_string((*e)->port());
  auto taken = MetricsExporter::Start(again);
  ASSERT_FALSE(taken.ok());
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(taken.status().message()), HasSubstr("metrics.listen"));
}

// Records what the scheduler reports.
class RecordingSink final : public MetricsSink {
 public:
  void RunStarted(const std::string& slot, const v1::Job& job, absl::Duration) override {
    Add("start " + slot + " " + job.name());
  }
  void Step(const std::string& slot, const StepReport& p) override {
    Add("step " + slot + " " + std::to_string(p.step));
  }
  void CheckpointSaved(const std::string& slot, const CheckpointInfo& c) override {
    Add("checkpoint " + slot + " " + std::to_string(c.step));
  }
  void RunStopped(const std::string& slot) override { Add("stop " + slot); }
  void StateEntered(const v1::Job&, v1::Job::State state) override { Add(v1::Job::State_Name(state)); }

  std::vector<std::string> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  void Add(std::string s) {
    absl::MutexLock lock(&mu_);
    calls_.push_back(std::move(s));
  }
  absl::Mutex mu_;
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
};

TEST(SchedulerMetricsTest, TheSchedulerReportsRunsStepsCheckpointsAndStates) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("oomb_metrics_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto store = OpenSqliteJobStore((dir / "oombd.db").string());
  ASSERT_TRUE(store.ok()) << store.status();
  WatchHub hub;
  RecordingSink sink;
  KvStatsRegistry kv;
  const KvStatsRegistry* seen_kv = nullptr;
  SchedulerOptions o;
  o.files = std::make_shared<const JobFiles>(JobFiles::Unconfined(dir.string()));
  o.devices = {"cpu"};
  o.metrics = &sink;
  o.kv_stats = &kv;
  o.runner = [&](const JobConfig&, const RunOptions& r) -> absl::StatusOr<RunResult> {
    seen_kv = r.kv_stats;
    r.on_step(StepReport{.step = 1, .total_steps = 2, .tokens = 10});
    r.on_checkpoint(CheckpointInfo{.step = 1, .path = r.checkpoint_dir->PathOf("c"), .bytes = 1});
    StepReport last{.step = 2, .total_steps = 2, .tokens = 20};
    last.evaluation = EvalReport{
        {EvalSuite::kPasskey, {.buckets = {}, .cells = {{.length = 64, .depth = 1, .correct = 1, .trials = 2}}}},
        {EvalSuite::kRuler, {.buckets = {}, .cells = {}, .ruler = {{RulerTask::kNiahSingle1, 64, 87.5, 8}}}}};
    r.on_step(last);
    return RunResult{};
  };
  {
    Scheduler scheduler(store->get(), &hub, o);
    ASSERT_TRUE(scheduler.Start().ok());
    v1::JobSpec spec;
    spec.mutable_model()->set_path("/m");
    spec.mutable_data()->set_train("/t");
    ASSERT_TRUE(SubmitSpec(scheduler, spec, "a", "").ok());
    for (int i = 0; i < 500 && (sink.calls().empty() || sink.calls().back() != "stop cpu"); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  EXPECT_THAT(sink.calls(),
              ::testing::ElementsAre("QUEUED", "RUNNING", "start cpu projects/default/jobs/a", "step cpu 1",
                                     "checkpoint cpu 1", "step cpu 2", "SUCCEEDED", "stop cpu"));
  EXPECT_EQ(seen_kv, &kv);
  // The evaluation is the job's progress (Progress.evaluation: `oomb get`, GetJob).
  absl::StatusOr<v1::Job> job = (*store)->Get("a");
  ASSERT_TRUE(job.ok());
  const v1::EvaluationResult& e = job->progress().evaluation();
  EXPECT_EQ(e.step(), 2);
  ASSERT_EQ(e.suites().size(), 2u);  // the suites that ran, by name
  const v1::EvaluationResult::Suite& passkey = e.suites().at("passkey");
  ASSERT_EQ(passkey.cells_size(), 1);
  EXPECT_EQ(passkey.cells(0).correct(), 1);
  EXPECT_EQ(passkey.accuracy(), 0.5);
  EXPECT_TRUE(passkey.buckets().empty());
  EXPECT_FALSE(passkey.has_effective_length());
  const v1::EvaluationResult::Suite& ruler = e.suites().at("ruler");  // RULER's scores by task and length
  ASSERT_EQ(ruler.tasks_size(), 1);
  EXPECT_EQ(ruler.tasks(0).task(), "niah_single_1");
  EXPECT_EQ(ruler.tasks(0).length(), 64);
  EXPECT_EQ(ruler.tasks(0).score(), 87.5);
  EXPECT_EQ(ruler.tasks(0).samples(), 8);
  ASSERT_EQ(ruler.averages_size(), 1);
  EXPECT_EQ(ruler.averages(0).score(), 87.5);
  EXPECT_EQ(ruler.threshold(), 85.6);
  EXPECT_EQ(ruler.effective_length(), 64);
  EXPECT_FALSE(ruler.has_accuracy());
  store->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace oomb::server
