// Data and tensor parallelism (worker/train/rank_group.h, worker/model/tensor_parallel.h,
// executor.h): k ranks with the same global batch give the gradients and the training of one
// device.
//   - Two processes joined over Gloo (c10d FileStore rendezvous): the all-reduced LoRA
//     gradients equal single-process gradients within 1e-6 (float32, relative to the largest).
//   - RunJob with resources.gpus = 2 on the CPU (two threads, Gloo): the same losses step for
//     step and the same adapter as one device; pause and resume across ranks continue the
//     same run; a cancel in the middle of a step stops every rank (no rank left waiting in a
//     collective).
//   - RunJob with parallel.tensor = 2 (alone, and twice data-parallel over 4 ranks): the losses
//     and the adapter of one device; a run paused on 2 tensor-parallel ranks resumes on one
//     device, and one paused on one device resumes on 2 ranks (the checkpoint is whole); on two
//     GPUs over NCCL, with an adapter to start from, the losses and adapter of one GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>

#include <torch/cuda.h>

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "tests/worker/test_files.h"
#include "tests/worker/tiny_model.h"
#include "tests/worker/train/dp_case.h"
#include "worker/hf/safetensors.h"
#include "worker/job/executor.h"

extern char** environ;

namespace oomb {
namespace {

using testing::FreshDir;

TEST(DataParallelTest, GlooTwoProcessesGiveTheGradientsOfOneProcess) {
  const std::string dir = FreshDir("dp_processes");
  const std::string store = dir + "/rendezvous", out = dir + "/grads.f32";
  std::vector<pid_t> pids;
  for (const char* rank : {"0", "1"}) {
    std::vector<std::string> args = {DP_RANK_BINARY, rank, "2", store, out};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, DP_RANK_BINARY, nullptr, nullptr, argv.data(), environ), 0);
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "dp_rank exited with " << status;
  }

  testing::DpCase c = testing::MakeDpCase();
  const at::Tensor want = testing::TrainShare(c, nullptr);
  std::ifstream in(out, std::ios::binary);
  std::vector<float> got_values(static_cast<size_t>(want.numel()));
  in.read(reinterpret_cast<char*>(got_values.data()), static_cast<std::streamsize>(got_values.size() * sizeof(float)));
  ASSERT_EQ(in.gcount(), static_cast<std::streamsize>(got_values.size() * sizeof(float)));
  const at::Tensor got = at::from_blob(got_values.data(), {want.numel()}, at::kFloat);
  const double scale = want.abs().max().item<double>();
  const double err = (got - want).abs().max().item<double>() / scale;
  EXPECT_GT(scale, 0);
  EXPECT_LE(err, 1e-6) << "max |dp - single| / max |single| over " << want.numel() << " gradients";
  // The processes really split the batch: one rank's share alone is far from the whole.
  testing::DpCase half = testing::MakeDpCase();
  half.batch.resize(2);
  EXPECT_GT((testing::TrainShare(half, nullptr) - want).abs().max().item<double>() / scale, 1e-2);
}

struct Fixture {
  std::string root, model_dir, data_path;
};

Fixture MakeFixture(const std::string& name) {
  Fixture f;
  f.root = FreshDir(name);
  f.model_dir = f.root + "/model";
  f.data_path = f.root + "/train.jsonl";
  const ModelConfig c = testing::TinyLlamaConfig();
  testing::WriteTinyModelDir(f.model_dir, c, at::kFloat, /*seed=*/5);
  testing::WriteInputIdsJsonl(f.data_path, testing::RandomDocs(9, 10, 40, c.vocab_size, 17));
  return f;
}

JobConfig MakeSpec(const Fixture& f, int gpus, int tensor = 1) {
  JobConfig s;
  s.model.path = f.model_dir;
  s.model.dtype = ModelDtype::kFloat32;
  s.method.type = TrainMethod::kLora;
  s.method.lora.rank = 4;
  s.method.lora.alpha = 8;
  s.method.lora.dropout = 0.1;  // the masks follow the sequence's index in the global batch
  s.data.train = f.data_path;
  s.data.max_seq_len = 48;
  s.data.shuffle_seed = 3;
  s.training.max_steps = 4;
  s.training.batch_sequences = 3;  // uneven across 2 ranks on purpose
  s.training.learning_rate = 5e-2;
  s.training.max_grad_norm = 0.5;
  s.memory.chunk_tokens = 16;
  s.memory.page_tokens = 8;
  s.checkpoint.every_steps = 1;
  s.checkpoint.keep_last = 20;
  s.resources.device = "cpu";
  s.resources.gpus = gpus;
  s.parallel.tensor = tensor;
  return s;
}

struct Outcome {
  absl::StatusOr<RunResult> result;
  std::vector<double> losses;
  std::vector<std::string> logs;
};

Outcome RunOnce(const JobConfig& job, const std::string& ckpt, bool resume = false,
                std::function<StopRequest()> poll = nullptr) {
  Outcome o;
  RunOptions options;
  options.files = FileAccess::Unconfined();
  options.checkpoint_dir = testing::MakeDirs(ckpt);
  for (int r = 0; r < job.resources.gpus; ++r) {
    options.devices.push_back(job.resources.device == "cpu" ? "cpu" : "cuda:" + std::to_string(r));
  }
  options.resume = resume;
  options.on_step = [&](const StepReport& p) { o.losses.push_back(p.loss); };
  options.on_log = [&](const std::string& line) { o.logs.push_back(line); };
  options.poll_stop = poll ? poll : [] { return StopRequest::kNone; };
  o.result = RunJob(job, options);
  return o;
}

std::vector<float> AdapterValues(const std::string& checkpoint) {
  auto file = SafetensorsFile::Open(*testing::OpenFile(checkpoint + "/adapter_model.safetensors"));
  EXPECT_TRUE(file.ok()) << file.status();
  std::vector<float> values;
  if (!file.ok()) return values;
  for (const TensorView& t : (*file)->tensors()) {
    EXPECT_EQ(t.dtype, DType::kF32) << t.name;
    const auto* p = static_cast<const float*>(t.data);
    values.insert(values.end(), p, p + t.nbytes / sizeof(float));
  }
  return values;
}

void ExpectClose(const std::vector<double>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], rel * std::abs(want[i])) << "step " << i + 1;
}

// The adapter of `b` equals `a`'s within `rel` of the largest value.
void ExpectSameAdapter(const std::string& a, const std::string& b, double rel) {
  const std::vector<float> x = AdapterValues(a), y = AdapterValues(b);
  ASSERT_EQ(x.size(), y.size());
  ASSERT_FALSE(x.empty());
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::abs(x[i] - y[i])));
    max_abs = std::max(max_abs, static_cast<double>(std::abs(x[i])));
  }
  EXPECT_LE(max_diff, rel * max_abs);
}

TEST(DataParallelTest, TwoCpuRanksTrainLikeOneDevice) {
  const Fixture f = MakeFixture("dp_run");
  const Outcome one = RunOnce(MakeSpec(f, 1), f.root + "/one");
  const Outcome two = RunOnce(MakeSpec(f, 2), f.root + "/two");
  ASSERT_TRUE(one.result.ok()) << one.result.status();
  ASSERT_TRUE(two.result.ok()) << two.result.status();
  ASSERT_EQ(one.losses.size(), 4u);
  ExpectClose(two.losses, one.losses, 1e-5);
  ExpectSameAdapter(one.result->final_checkpoint.path, two.result->final_checkpoint.path, 1e-5);
  // Rank 0 alone writes metrics.jsonl: one line per step.
  std::ifstream metrics(f.root + "/two/metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line);) ++lines;
  EXPECT_EQ(lines, 4);
}

TEST(DataParallelTest, PauseAndResumeAcrossRanksContinueTheRun) {
  const Fixture f = MakeFixture("dp_pause");
  const JobConfig job = MakeSpec(f, 2);
  const Outcome whole = RunOnce(job, f.root + "/whole");
  ASSERT_TRUE(whole.result.ok()) << whole.result.status();
  // Pause at the first poll inside step 3 (a chunk boundary of rank 0's first sequence).
  int steps = 0;
  Outcome paused;
  {
    RunOptions options;
    int polls_in_step3 = 0;
    options.files = FileAccess::Unconfined();
    options.checkpoint_dir = testing::MakeDirs(f.root + "/paused");
    options.devices = {"cpu", "cpu"};
    options.on_step = [&](const StepReport& p) {
      paused.losses.push_back(p.loss);
      steps = static_cast<int>(p.step);
    };
    options.poll_stop = [&] { return steps == 2 && ++polls_in_step3 == 2 ? StopRequest::kPause : StopRequest::kNone; };
    paused.result = RunJob(job, options);
  }
  ASSERT_TRUE(paused.result.ok()) << paused.result.status();
  EXPECT_EQ(paused.result->outcome, RunOutcome::kPaused);
  EXPECT_EQ(paused.result->final_checkpoint.step, 2);
  const Outcome resumed = RunOnce(job, f.root + "/paused", /*resume=*/true);
  ASSERT_TRUE(resumed.result.ok()) << resumed.result.status();
  std::vector<double> losses = paused.losses;
  losses.insert(losses.end(), resumed.losses.begin(), resumed.losses.end());
  ExpectClose(losses, whole.losses, 1e-6);
}

TEST(DataParallelTest, CancelInsideAStepStopsEveryRank) {
  const Fixture f = MakeFixture("dp_cancel");
  int polls = 0;
  const Outcome o = RunOnce(MakeSpec(f, 2), f.root + "/c", false,
                            [&] { return ++polls == 3 ? StopRequest::kCancel : StopRequest::kNone; });
  ASSERT_TRUE(o.result.ok()) << o.result.status();
  EXPECT_EQ(o.result->outcome, RunOutcome::kCancelled);
  EXPECT_TRUE(o.losses.empty());
}

TEST(DataParallelTest, DevicesMustMatchTheRanks) {
  const Fixture f = MakeFixture("dp_devices");
  JobConfig job = MakeSpec(f, 2);
  RunOptions options;
  options.files = FileAccess::Unconfined();
  options.checkpoint_dir = testing::MakeDirs(f.root + "/x");
  options.devices = {"cpu"};
  const auto r = RunJob(job, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("resources.gpus: 2 but the run was given 1 devices"), std::string::npos)
      << r.status();
}

TEST(TensorParallelRunTest, TwoRanksAloneAndTwiceDataParallelTrainLikeOneDevice) {
  const Fixture f = MakeFixture("tp_run");
  const Outcome one = RunOnce(MakeSpec(f, 1), f.root + "/one");
  ASSERT_TRUE(one.result.ok()) << one.result.status();
  for (const int gpus : {2, 4}) {
    const std::string dir = f.root + "/tp2x" + std::to_string(gpus / 2);
    const Outcome tp = RunOnce(MakeSpec(f, gpus, /*tensor=*/2), dir);
    ASSERT_TRUE(tp.result.ok()) << tp.result.status();
    const std::string groups =
        gpus == 2 ? "1 group of 2 ranks (cpu, cpu)" : "2 groups of 2 ranks (cpu, cpu | cpu, cpu)";
    EXPECT_THAT(tp.logs, ::testing::Contains("tensor parallel: " + groups + ", Gloo over loopback"));
    ExpectClose(tp.losses, one.losses, 1e-5);
    ExpectSameAdapter(one.result->final_checkpoint.path, tp.result->final_checkpoint.path, 1e-5);
    // The periodic checkpoints are whole too.
    ExpectSameAdapter(f.root + "/one/checkpoint-2", dir + "/checkpoint-2", 1e-5);
  }
}

// Paused at the end of step 2 with `paused_job`, resumed with `resumed_job`: the losses of the
// whole run.
void ExpectPauseAndResumeContinue(const JobConfig& paused_job, const JobConfig& resumed_job,
                                  const std::vector<double>& whole, const std::string& dir) {
  std::vector<double> losses;
  RunOptions options;
  options.files = FileAccess::Unconfined();
  options.checkpoint_dir = testing::MakeDirs(dir);
  options.devices.assign(static_cast<size_t>(paused_job.resources.gpus), "cpu");
  options.on_step = [&](const StepReport& p) { losses.push_back(p.loss); };
  options.poll_stop = [&] { return losses.size() == 2 ? StopRequest::kPauseAtStepEnd : StopRequest::kNone; };
  const absl::StatusOr<RunResult> paused = RunJob(paused_job, options);
  ASSERT_TRUE(paused.ok()) << paused.status();
  EXPECT_EQ(paused->outcome, RunOutcome::kPaused);
  EXPECT_EQ(paused->final_checkpoint.step, 2);
  const Outcome resumed = RunOnce(resumed_job, dir, /*resume=*/true);
  ASSERT_TRUE(resumed.result.ok()) << resumed.result.status();
  losses.insert(losses.end(), resumed.losses.begin(), resumed.losses.end());
  ExpectClose(losses, whole, 1e-5);
}

TEST(TensorParallelRunTest, CheckpointsResumeAtAnotherDegree) {
  const Fixture f = MakeFixture("tp_resume");
  const Outcome whole = RunOnce(MakeSpec(f, 1), f.root + "/whole");
  ASSERT_TRUE(whole.result.ok()) << whole.result.status();
  ExpectPauseAndResumeContinue(MakeSpec(f, 2, 2), MakeSpec(f, 1), whole.losses, f.root + "/two_to_one");
  ExpectPauseAndResumeContinue(MakeSpec(f, 1), MakeSpec(f, 2, 2), whole.losses, f.root + "/one_to_two");
}

// Starting from an adapter (a first run's one step), one device and two tensor-parallel ranks on
// `device` ("cpu" or "cuda") train alike: losses and adapter within `rel`. Returns the two ranks'
// run (empty losses when a run failed).
Outcome TwoRanksFromAnAdapter(const std::string& name, const std::string& device, double rel) {
  const Fixture f = MakeFixture(name);
  JobConfig start = MakeSpec(f, 1);
  start.training.max_steps = 1;
  const Outcome adapter = RunOnce(start, f.root + "/start");
  EXPECT_TRUE(adapter.result.ok()) << adapter.result.status();
  if (!adapter.result.ok()) return Outcome{absl::UnknownError("a run failed"), {}, {}};
  JobConfig one = MakeSpec(f, 1), two = MakeSpec(f, 2, /*tensor=*/2);
  for (JobConfig* job : {&one, &two}) {
    job->resources.device = device;
    job->method.lora.init_adapter = adapter.result->final_checkpoint.path;
  }
  const Outcome a = RunOnce(one, f.root + "/one");
  Outcome b = RunOnce(two, f.root + "/two");
  EXPECT_TRUE(a.result.ok()) << a.result.status();
  EXPECT_TRUE(b.result.ok()) << b.result.status();
  if (!a.result.ok() || !b.result.ok()) return Outcome{absl::UnknownError("a run failed"), {}, {}};
  ExpectClose(b.losses, a.losses, rel);
  ExpectSameAdapter(a.result->final_checkpoint.path, b.result->final_checkpoint.path, rel);
  return b;
}

TEST(TensorParallelRunTest, StartsFromAnAdapterLikeOneDevice) { TwoRanksFromAnAdapter("tp_init", "cpu", 1e-5); }

// On GPUs over NCCL (skipped with fewer than two), float32: two tensor-parallel ranks train as one
// GPU does, and the run says how the GPUs are linked (as NVML reports it).
TEST(TensorParallelGpuTest, TwoGpusOverNcclTrainLikeOne) {
  if (!torch::cuda::is_available() || torch::cuda::device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  const Outcome two = TwoRanksFromAnAdapter("tp_gpu", "cuda", 1e-4);
  bool reported = false;
  for (const std::string& line : two.logs) {
    if (line.rfind("tensor parallel: 1 group of 2 ranks (cuda:0, cuda:1), ", 0) != 0) continue;
    reported = true;
    EXPECT_EQ(line.find("unknown"), std::string::npos) << line;
    std::cout << line << "\n";
  }
  EXPECT_TRUE(reported);
}

}  // namespace
}  // namespace oomb
