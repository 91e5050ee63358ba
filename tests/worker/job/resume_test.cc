// Resume exactness (executor.h's contract): a job paused at a step boundary or in the middle of
// a step and resumed from its checkpoint produces, step for step, the same losses as the same
// job run without interruption, and the same final adapter; a torn newest checkpoint is
// detected by its checksum and the one before it is used.
//
// Bitwise, not approximately: on the CPU in float32 the resumed run performs the same floating-
// point operations in the same order on the same bits (LoRA weights restored bit-exactly from
// float32 safetensors, AdamW moments and step counts from the optimizer state, the data cursor
// and epoch from trainer_state.json, dropout masks seeded from the step), and LibTorch's CPU
// kernels are deterministic for a fixed thread count. Any difference at all means some state
// was lost or re-derived differently, so the test asserts equality of the double losses.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/worker/test_env.h"
#include "tests/worker/test_files.h"
#include "tests/worker/tiny_model.h"
#include "worker/job/device.h"
#include "worker/job/executor.h"
#include "worker/job/model_tools.h"

namespace oomb {
namespace {

namespace fs = std::filesystem;
using testing::FreshDir;

struct Fixture {
  std::string model_dir, data_path;
};

Fixture MakeFixture(const std::string& name) {
  Fixture f;
  const std::string root = FreshDir(name);
  f.model_dir = root + "/model";
  f.data_path = root + "/train.jsonl";
  const ModelConfig c = testing::TinyLlamaConfig();
  testing::WriteTinyModelDir(f.model_dir, c, at::kFloat, /*seed=*/5);
  // 7 documents of 10..40 tokens, packed into sequences of <= 48: a few sequences an epoch,
  // so 8 steps of 2 sequences cross epoch boundaries (reshuffled with seed + epoch).
  testing::WriteInputIdsJsonl(f.data_path, testing::RandomDocs(7, 10, 40, c.vocab_size, 17));
  return f;
}

JobConfig MakeSpec(const Fixture& f) {
  JobConfig s;
  s.model.path = f.model_dir;
  s.model.dtype = ModelDtype::kFloat32;
  s.method.type = TrainMethod::kLora;
  s.method.lora.rank = 4;
  s.method.lora.alpha = 8;
  s.method.lora.dropout = 0.1;  // masks must be reproduced after resume
  s.data.train = f.data_path;
  s.data.max_seq_len = 48;
  s.data.shuffle_seed = 3;
  s.training.max_steps = 8;
  s.training.batch_sequences = 2;
  s.training.learning_rate = 5e-2;
  s.training.lr_schedule = LrSchedule::kCosine;
  s.training.warmup_steps = 2;
  s.training.weight_decay = 0.01;
  s.training.max_grad_norm = 0.5;
  s.memory.chunk_tokens = 16;
  s.memory.page_tokens = 8;
  s.checkpoint.every_steps = 1;
  s.checkpoint.keep_last = 20;
  s.resources.device = "cpu";
  return s;
}

struct Outcome {
  RunOutcome outcome = RunOutcome::kSucceeded;
  std::vector<std::pair<int64_t, double>> losses;  // (step, loss) from on_step
  std::vector<double> densities;                   // StepReport::attention_density
  std::vector<std::string> warnings;
};

// Runs the job; `pause_at_poll` > 0 asks for a pause at that poll_stop call counted from the end
// of step `pause_after_step` (1: the poll right after the step; larger: a chunk boundary inside
// the next step).
Outcome RunOnce(const JobConfig& job, const std::string& ckpt, bool resume, int64_t pause_after_step = -1,
                int pause_at_poll = 0) {
  Outcome o;
  int64_t last_step = 0;
  int polls_after = 0;
  RunOptions options;
  options.files = FileAccess::Unconfined();
  options.checkpoint_dir = testing::MakeDirs(ckpt);
  options.devices = {"cpu"};
  options.resume = resume;
  options.on_step = [&](const StepReport& p) {
    o.losses.emplace_back(p.step, p.loss);
    o.densities.push_back(p.attention_density);
    last_step = p.step;
  };
  options.on_warning = [&](const std::string& w) { o.warnings.push_back(w); };
  options.poll_stop = [&]() {
    if (pause_at_poll > 0 && last_step == pause_after_step && ++polls_after == pause_at_poll) {
      return StopRequest::kPause;
    }
    return StopRequest::kNone;
  };
  auto r = RunJob(job, options);
  EXPECT_TRUE(r.ok()) << r.status();
  if (r.ok()) o.outcome = r->outcome;
  return o;
}

// The job run uninterrupted into `root`/full and again into `root`/split, paused after step 5
// (its newest checkpoint checkpoint-5): the uninterrupted run's outcome.
Outcome RunFullAndPausedAfterStep5(const JobConfig& job, const std::string& root) {
  Outcome full = RunOnce(job, root + "/full", false);
  EXPECT_EQ(full.losses.size(), 8u);
  const Outcome first = RunOnce(job, root + "/split", false, /*pause_after_step=*/5, 1);
  EXPECT_EQ(first.outcome, RunOutcome::kPaused);
  return full;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void ExpectSameLosses(const std::vector<std::pair<int64_t, double>>& got,
                      const std::vector<std::pair<int64_t, double>>& want, int64_t first_step) {
  ASSERT_EQ(got.size(), want.size() - static_cast<size_t>(first_step - 1));
  for (size_t i = 0; i < got.size(); ++i) {
    const auto& w = want[i + first_step - 1];
    EXPECT_EQ(got[i].first, w.first);
    // Bitwise (see the file comment).
    EXPECT_EQ(got[i].second, w.second) << "step " << w.first << ": resumed " << got[i].second << " vs uninterrupted "
                                       << w.second;
  }
}

class ResumeTest : public ::testing::TestWithParam<int> {};

// GetParam(): the poll at which the pause comes after step 3 (1: at the step boundary; 4: at a
// chunk boundary inside step 4, whose partial gradients must be discarded).
TEST_P(ResumeTest, ResumedLossesEqualUninterruptedRun) {
  const Fixture f = MakeFixture("resume_" + std::to_string(GetParam()));
  const JobConfig job = MakeSpec(f);
  const std::string full_dir = fs::path(f.model_dir).parent_path().string() + "/full";
  const std::string split_dir = fs::path(f.model_dir).parent_path().string() + "/split";

  const Outcome full = RunOnce(job, full_dir, false);
  ASSERT_EQ(full.outcome, RunOutcome::kSucceeded);
  ASSERT_EQ(full.losses.size(), 8u);
  for (const auto& [step, loss] : full.losses) std::cout << "step " << step << " loss " << loss << "\n";
  // The loss moves: the test would see a resumed run that silently restarted from scratch.
  EXPECT_NE(full.losses.front().second, full.losses.back().second);

  const Outcome first = RunOnce(job, split_dir, false, /*pause_after_step=*/3, GetParam());
  ASSERT_EQ(first.outcome, RunOutcome::kPaused);
  ASSERT_EQ(first.losses.size(), 3u);
  ASSERT_TRUE(fs::exists(split_dir + "/checkpoint-3"));
  EXPECT_FALSE(fs::exists(split_dir + "/checkpoint-4"));

  const Outcome second = RunOnce(job, split_dir, true);
  ASSERT_EQ(second.outcome, RunOutcome::kSucceeded);
  ExpectSameLosses(second.losses, full.losses, 4);
  // The same adapter, byte for byte.
  const std::string want = ReadBytes(full_dir + "/final/adapter_model.safetensors");
  ASSERT_FALSE(want.empty());
  EXPECT_TRUE(want == ReadBytes(split_dir + "/final/adapter_model.safetensors")) << "final adapters differ";

  // metrics.jsonl: the paused run's lines, then the resumed run's, one per step, same losses.
  std::ifstream metrics(split_dir + "/metrics.jsonl");
  std::vector<double> logged;
  for (std::string line; std::getline(metrics, line);) logged.push_back(nlohmann::json::parse(line)["loss"]);
  ASSERT_EQ(logged.size(), 8u);
  for (size_t i = 0; i < logged.size(); ++i) EXPECT_EQ(logged[i], full.losses[i].second) << "metrics line " << i + 1;
}

INSTANTIATE_TEST_SUITE_P(PausePoints, ResumeTest, ::testing::Values(1, 4),
                         [](const auto& info) { return info.param == 1 ? "AtStepBoundary" : "InsideAStep"; });

// method.lora.init_adapter: a job started from another run's adapter trains from those weights
// (with warm-up, step 1's learning rate is 0, so one step leaves them exactly as loaded); a
// missing adapter fails the job naming the field.
TEST(ResumeTest, InitAdapterStartsFromAnotherRunsWeights) {
  const Fixture f = MakeFixture("init_adapter");
  JobConfig job = MakeSpec(f);
  job.method.lora.dropout = 0;
  const std::string root = fs::path(f.model_dir).parent_path().string();
  ASSERT_EQ(RunOnce(job, root + "/first", false).outcome, RunOutcome::kSucceeded);
  const std::string trained = ReadBytes(root + "/first/checkpoint-4/adapter_model.safetensors");
  ASSERT_FALSE(trained.empty());

  job.training.max_steps = 1;  // warmup_steps 2: the learning rate of step 1 is 0
  const Outcome fresh = RunOnce(job, root + "/fresh", false);
  EXPECT_FALSE(trained == ReadBytes(root + "/fresh/final/adapter_model.safetensors"));
  job.method.lora.init_adapter = root + "/first/checkpoint-4";
  const Outcome continued = RunOnce(job, root + "/continued", false);
  ASSERT_EQ(continued.outcome, RunOutcome::kSucceeded);
  EXPECT_TRUE(trained == ReadBytes(root + "/continued/final/adapter_model.safetensors"));
  EXPECT_NE(fresh.losses[0].second, continued.losses[0].second);  // the loaded weights act

  job.method.lora.init_adapter = root + "/no-such-adapter";
  RunOptions options;
  options.files = FileAccess::Unconfined();
  options.checkpoint_dir = testing::MakeDirs(root + "/missing");
  options.devices = {"cpu"};
  auto r = RunJob(job, options);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("method.lora.init_adapter"));
}

// Runs `job` uninterrupted under root/full, and under root/split paused inside step 4 (at a
// chunk boundary) then resumed; expects the same losses and the same final adapter bytes.
// Returns the uninterrupted run.
Outcome ExpectPauseInsideAStepResumesExactly(const JobConfig& job, const std::string& root) {
  const Outcome full = RunOnce(job, root + "/full", false);
  EXPECT_EQ(full.outcome, RunOutcome::kSucceeded);
  const Outcome first = RunOnce(job, root + "/split", false, /*pause_after_step=*/3, /*pause_at_poll=*/4);
  EXPECT_EQ(first.outcome, RunOutcome::kPaused);
  const Outcome second = RunOnce(job, root + "/split", true);
  EXPECT_EQ(second.outcome, RunOutcome::kSucceeded);
  ExpectSameLosses(second.losses, full.losses, 4);
  EXPECT_TRUE(ReadBytes(root + "/full/final/adapter_model.safetensors") ==
              ReadBytes(root + "/split/final/adapter_model.safetensors"));
  return full;
}

// SpaCO (backward.chunk_fraction 0.5) through the executor: its chunk draws follow the step, so
// a run paused inside a step and resumed equals the uninterrupted one bit for bit; and it is
// not the exact run (some chunks were dropped).
TEST(ResumeTest, SpacoRunResumesExactly) {
  const Fixture f = MakeFixture("resume_spaco");
  JobConfig job = MakeSpec(f);
  const std::string root = fs::path(f.model_dir).parent_path().string();
  const Outcome exact = RunOnce(job, root + "/exact", false);
  job.chunk_fraction = 0.5;
  const Outcome full = ExpectPauseInsideAStepResumesExactly(job, root);
  EXPECT_NE(exact.losses.back().second, full.losses.back().second);
}

// Sparse attention through the executor (attention.mode: sparse, 2 of up to 6 pages a tile):
// a run paused inside a step and resumed equals the uninterrupted one bit for bit, each step
// reports the attention's density, and the sparse run is not the dense one.
TEST(ResumeTest, SparseRunResumesExactly) {
  const Fixture f = MakeFixture("resume_sparse");
  JobConfig job = MakeSpec(f);
  const std::string root = fs::path(f.model_dir).parent_path().string();
  const Outcome dense = RunOnce(job, root + "/dense", false);
  job.sparse =
      JobConfig::Sparse{.page_budget = 2, .sink_pages = 1, .local_pages = 0, .selection = PageSummaryKind::kMeanKey};
  const Outcome full = ExpectPauseInsideAStepResumesExactly(job, root);
  EXPECT_NE(dense.losses.back().second, full.losses.back().second);
  // Short sequences have no more past pages than the budget: density 1 on those steps.
  for (double d : full.densities) {
    EXPECT_GT(d, 0.0);
    EXPECT_LE(d, 1.0);
  }
  EXPECT_LT(*std::min_element(full.densities.begin(), full.densities.end()), 1.0);
  for (double d : dense.densities) EXPECT_EQ(d, 0.0);
}

// The router's auxiliary loss through the executor, on the tiny Qwen3-MoE (whose config.json has
// none) with model.router_aux_loss_coef and LoRA on attention and the expert banks: every
// metrics.jsonl line carries router_aux_loss (the batch's mean, in (0, E top_k] = (0, 8]), the run
// trains differently from the one without it (whose lines have no such field), and a run paused
// inside a step resumes exactly.
TEST(ResumeTest, RouterAuxLossRunResumesExactly) {
  const std::string model = testing::DataDir() + "/tiny/qwen3-moe";
  if (!fs::exists(model)) GTEST_SKIP() << "no " << model;
  const std::string root = FreshDir("resume_router_aux");
  const Fixture f{.model_dir = model, .data_path = root + "/train.jsonl"};
  testing::WriteInputIdsJsonl(f.data_path, testing::RandomDocs(7, 10, 40, /*vocab=*/320, 17));
  JobConfig job = MakeSpec(f);
  job.method.lora.dropout = 0;  // PEFT takes none on expert banks
  const Outcome without = RunOnce(job, root + "/without", false);
  ASSERT_EQ(without.outcome, RunOutcome::kSucceeded);
  job.model.router_aux_loss_coef = 0.5;
  const Outcome full = ExpectPauseInsideAStepResumesExactly(job, root);
  EXPECT_NE(without.losses.back().second, full.losses.back().second);
  const auto lines = [](const std::string& path) {
    std::vector<nlohmann::json> out;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
    return out;
  };
  const std::vector<nlohmann::json> with_aux = lines(root + "/full/metrics.jsonl");
  ASSERT_EQ(with_aux.size(), 8u);
  for (const nlohmann::json& j : with_aux) {
    ASSERT_TRUE(j.contains("router_aux_loss")) << j.dump();
    EXPECT_GT(j["router_aux_loss"].get<double>(), 0.0) << j.dump();
    EXPECT_LE(j["router_aux_loss"].get<double>(), 8.0) << j.dump();
  }
  for (const nlohmann::json& j : lines(root + "/without/metrics.jsonl")) EXPECT_FALSE(j.contains("router_aux_loss"));
}

// The host tier through the executor (memory.kv_offload: host, every page in host pools moved by
// the copy engine): the same losses, bit for bit, as the run with every page on the device; a
// run paused inside a step and resumed equals the uninterrupted one; metrics.jsonl counts the
// engine's bytes each way and the host-tier peak.
TEST(ResumeTest, HostTierRunEqualsDeviceRunAndResumesExactly) {
  const Fixture f = MakeFixture("resume_host_tier");
  JobConfig job = MakeSpec(f);
  const std::string root = fs::path(f.model_dir).parent_path().string();
  job.memory.kv_offload = KvOffload::kNone;
  const Outcome device = RunOnce(job, root + "/device", false);
  job.memory.kv_offload = KvOffload::kHost;
  const Outcome full = ExpectPauseInsideAStepResumesExactly(job, root);
  ExpectSameLosses(full.losses, device.losses, 1);
  std::ifstream metrics(root + "/full/metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_GT(j.at("pcie_h2d_bytes").get<int64_t>(), 0) << line;
    EXPECT_GT(j.at("pcie_d2h_bytes").get<int64_t>(), 0) << line;
    EXPECT_GT(j.at("peak_host_bytes").get<int64_t>(), 0) << line;
    ++lines;
  }
  EXPECT_EQ(lines, 8);
}

// A torn newest checkpoint (a file cut short, as a crash during a non-atomic copy would leave
// it) fails its checksum; resume warns, takes the one before, and the losses still match.
TEST(ResumeTest, TornCheckpointIsSkipped) {
  const Fixture f = MakeFixture("torn");
  const JobConfig job = MakeSpec(f);
  const std::string root = fs::path(f.model_dir).parent_path().string();
  const Outcome full = RunFullAndPausedAfterStep5(job, root);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::string newest = root + "/split/checkpoint-5";
  const fs::path victim = newest + "/adapter_model.safetensors";
  ASSERT_TRUE(fs::exists(victim));
  fs::resize_file(victim, fs::file_size(victim) - 7);

  const Outcome second = RunOnce(job, root + "/split", true);
  ASSERT_EQ(second.outcome, RunOutcome::kSucceeded);
  bool skipped = false, resumed_at_4 = false;
  for (const std::string& w : second.warnings) {
    std::cout << "warning: " << w << "\n";
    skipped |= w.find("checkpoint-5") != std::string::npos && w.find("checksum") != std::string::npos;
    resumed_at_4 |= w.find("checkpoint-4 at step 4") != std::string::npos;
  }
  EXPECT_TRUE(skipped) << "no warning naming the torn checkpoint and its checksum";
  EXPECT_TRUE(resumed_at_4) << "did not resume from checkpoint-4";
  ExpectSameLosses(second.losses, full.losses, 5);
}

// A checkpoint's trainer_state.json is Hugging Face's TrainerState, its log the run's losses;
// the resume state is oomb_state.json. A checkpoint written before oomb_state.json existed kept
// that state in trainer_state.json (oomb's keys), and still resumes exactly.
TEST(ResumeTest, CheckpointOfTheOlderLayoutResumesExactly) {
  const Fixture f = MakeFixture("older");
  const JobConfig job = MakeSpec(f);
  const std::string root = fs::path(f.model_dir).parent_path().string();
  const Outcome full = RunFullAndPausedAfterStep5(job, root);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::string ckpt = root + "/split/checkpoint-5";
  const auto hf = nlohmann::json::parse(ReadBytes(ckpt + "/trainer_state.json"));
  EXPECT_EQ(hf["global_step"], 5);
  ASSERT_EQ(hf["log_history"].size(), 5u) << hf.dump(2);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(hf["log_history"][i]["step"], full.losses[i].first);
    EXPECT_EQ(hf["log_history"][i]["loss"].get<double>(), full.losses[i].second);
  }
  ASSERT_TRUE(fs::exists(ckpt + "/oomb_state.json"));

  // The older layout: oomb's state in trainer_state.json, the manifest naming it so.
  fs::remove(ckpt + "/trainer_state.json");
  fs::rename(ckpt + "/oomb_state.json", ckpt + "/trainer_state.json");
  auto manifest = nlohmann::json::parse(ReadBytes(ckpt + "/oomb_checkpoint.json"));
  manifest["files"]["trainer_state.json"] = manifest["files"]["oomb_state.json"];
  manifest["files"].erase("oomb_state.json");
  std::ofstream(ckpt + "/oomb_checkpoint.json") << manifest.dump(2);

  const Outcome second = RunOnce(job, root + "/split", true);
  ASSERT_EQ(second.outcome, RunOutcome::kSucceeded);
  EXPECT_THAT(second.warnings, ::testing::Contains(::testing::HasSubstr("checkpoint-5 at step 5")));
  ExpectSameLosses(second.losses, full.losses, 6);
}

// The eval loss of a job with a validation set (every training.eval_every_steps, and after the
// last step) is the loss `oombd model eval` computes on the validation file with that step's
// adapter. (Without packing, 7 sequences an epoch and batches of 2: step 4's batch crosses into
// epoch 1, which once left the batch pointing into the re-packed previous epoch.)
TEST(ResumeTest, PeriodicEvalLossEqualsModelEvalOfThatStepsAdapter) {
  const Fixture f = MakeFixture("eval");
  JobConfig job = MakeSpec(f);
  const std::string root = fs::path(f.model_dir).parent_path().string();
  job.data.validation = root + "/val.jsonl";
  job.data.packing = false;  // one sample a sequence, as the evaluation scores them
  testing::WriteInputIdsJsonl(job.data.validation, testing::RandomDocs(3, 12, 30, 61, 99));
  job.training.max_steps = 5;  // evaluations after steps 2 and 4, and after the last
  job.training.eval_every_steps = 2;
  std::vector<std::pair<int64_t, double>> evals;
  RunOptions options;
  options.files = FileAccess::Unconfined();
  options.checkpoint_dir = testing::MakeDirs(root + "/ckpt");
  options.devices = {"cpu"};
  options.on_step = [&](const StepReport& p) {
    if (p.eval_loss > 0) evals.emplace_back(p.step, p.eval_loss);
  };
  auto r = RunJob(job, options);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(evals.size(), 3u);
  EXPECT_EQ(evals[0].first, 2);
  EXPECT_EQ(evals[1].first, 4);
  EXPECT_EQ(evals[2].first, 5);
  for (const auto& [step, loss] : evals) {
    EvalOptions e;
    e.model_dir = f.model_dir;
    e.data_path = job.data.validation;
    e.adapter_dir = root + "/ckpt/" + (step == job.training.max_steps ? "final" : "checkpoint-" + std::to_string(step));
    e.chunk_tokens = job.memory.chunk_tokens;
    e.device = "cpu";
    auto want = EvaluateModel(e);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_NEAR(loss, want->mean_loss, 1e-5 * want->mean_loss) << "step " << step;
  }
  EXPECT_NE(evals[0].second, evals[1].second);  // the adapter moved between the evaluations
}

// A pause asked for while the step's evaluation runs (at one of its chunk boundaries) stops the
// run cleanly at the end of that step: the step is reported without an eval loss and its
// checkpoint written, rather than the evaluation's CANCELLED failing the run.
// `oombd model eval --device` is parsed as a job's resources.device (worker/job/device.h): a
// device the machine lacks is an error naming the flag, not another device; a malformed one
// is INVALID_ARGUMENT, not a crash.
TEST(ModelToolsTest, TheDeviceIsTheOneAskedForOrAnError) {
  EXPECT_EQ(ResolveDevice("cuda:x", "--device").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveDevice("gpu", "--device").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveDevice("cpu", "--device").value(), ComputeDevice{});
  const int64_t gpus = torch::cuda::device_count();
  const std::string missing = "cuda:" + std::to_string(gpus);
  EXPECT_EQ(ResolveDevice(missing, "--device").status().code(), absl::StatusCode::kFailedPrecondition);
  const Fixture f = MakeFixture("device");
  const std::string data = fs::path(f.model_dir).parent_path().string() + "/val.jsonl";
  testing::WriteInputIdsJsonl(data, testing::RandomDocs(1, 12, 30, 61, 99));
  EvalOptions e;
  e.model_dir = f.model_dir;
  e.data_path = data;
  e.device = missing;
  const absl::StatusOr<EvalResult> r = EvaluateModel(e);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("--device: '" + missing + "'"));
  e.device = "cpu";
  EXPECT_TRUE(EvaluateModel(e).ok());
}

// `oombd model eval` is the evaluate job (method.type evaluate) run by the executor: its loss,
// label tokens and samples over --data cut after --max-tokens are those of the job with
// data.validation and data.validation_max_tokens (each sample its own sequence), which writes
// them to metrics.jsonl. The cut keeps whole samples and cuts the last one.
TEST(ModelToolsTest, ModelEvalIsTheEvaluateJob) {
  const Fixture f = MakeFixture("evaljob");
  const std::string root = fs::path(f.model_dir).parent_path().string();
  const std::vector<std::vector<int64_t>> docs = testing::RandomDocs(4, 12, 30, 61, 7);
  const std::string data = root + "/val.jsonl";
  testing::WriteInputIdsJsonl(data, docs);
  const int64_t max_tokens = static_cast<int64_t>(docs[0].size() + docs[1].size()) + 5;  // 2 whole, 5 of the 3rd
  JobConfig job = MakeSpec(f);
  job.method.type = TrainMethod::kEvaluate;
  job.data.train.clear();
  job.data.validation = data;
  job.data.packing = false;
  job.data.validation_max_tokens = max_tokens;
  RunOptions options;
  options.files = FileAccess::Unconfined();
  options.checkpoint_dir = testing::MakeDirs(root + "/evaljob");
  options.devices = {"cpu"};
  std::optional<StepReport> report;
  options.on_step = [&](const StepReport& p) { report = p; };
  ASSERT_TRUE(RunJob(job, options).ok());
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->eval_samples, 3);
  // A sample of n tokens has n - 1 labels (each token predicts the next).
  EXPECT_EQ(report->eval_tokens, static_cast<int64_t>(docs[0].size() - 1 + docs[1].size() - 1 + 5 - 1));
  std::ifstream metrics(root + "/evaljob/metrics.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(metrics, line));
  const auto logged = nlohmann::json::parse(line);
  EXPECT_EQ(logged["eval_tokens"], report->eval_tokens);
  EXPECT_EQ(logged["eval_samples"], 3);

  EvalOptions e;
  e.model_dir = f.model_dir;
  e.data_path = data;
  e.max_tokens = max_tokens;
  e.chunk_tokens = job.memory.chunk_tokens;
  e.dtype = "float32";
  e.device = "cpu";
  const absl::StatusOr<EvalResult> r = EvaluateModel(e);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->samples, report->eval_samples);
  EXPECT_EQ(r->tokens, report->eval_tokens);
  EXPECT_NEAR(r->mean_loss, report->eval_loss, 1e-6 * report->eval_loss);
  // The job's errors name the command's flags.
  e.data_path = root + "/missing.jsonl";
  EXPECT_THAT(std::string(EvaluateModel(e).status().message()), ::testing::StartsWith("--data: "));
}

TEST(ResumeTest, PauseDuringTheEvaluationPausesAtTheStepsEnd) {
  const Fixture f = MakeFixture("eval_pause");
  JobConfig job = MakeSpec(f);
  const std::string root = fs::path(f.model_dir).parent_path().string();
  testing::WriteInputIdsJsonl(root + "/val.jsonl", testing::RandomDocs(3, 30, 40, 61, 23));
  job.data.validation = root + "/val.jsonl";
  job.training.eval_every_steps = 2;
  // Step 2's polls, counted from step 1's report: its training chunks, then its evaluation's;
  // step 2's report comes after both. A first run counts them; the second pauses at the last.
  auto run = [&](const std::string& dir, int pause_at) {
    int64_t reported = 0;
    int polls = 0;
    std::vector<double> eval_losses;
    RunOptions options;
    options.files = FileAccess::Unconfined();
    options.checkpoint_dir = testing::MakeDirs(dir);
    options.devices = {"cpu"};
    options.on_step = [&](const StepReport& p) {
      reported = p.step;
      eval_losses.push_back(p.eval_loss);
    };
    options.poll_stop = [&] {
      if (reported == 1) ++polls;
      return reported == 1 && polls == pause_at ? StopRequest::kPause : StopRequest::kNone;
    };
    auto r = RunJob(job, options);
    EXPECT_TRUE(r.ok()) << r.status();
    return std::make_tuple(r.ok() ? r->outcome : RunOutcome::kCancelled, polls, eval_losses);
  };
  const auto [outcome, step2_polls, evals] = run(root + "/count", 0);
  ASSERT_EQ(outcome, RunOutcome::kSucceeded);
  ASSERT_GT(evals.at(1), 0);  // step 2 evaluated
  const auto [paused, polls, reported_evals] = run(root + "/ckpt", step2_polls);
  EXPECT_EQ(paused, RunOutcome::kPaused);
  ASSERT_EQ(reported_evals.size(), 2u);
  EXPECT_EQ(reported_evals[1], 0);  // step 2 reported, without the interrupted evaluation
  EXPECT_TRUE(fs::exists(root + "/ckpt/checkpoint-2"));
}

// The same for the evaluation section (suite positions at step 2): the step is trained and in
// the pause's checkpoint, so it is reported (metrics.jsonl, on_step) without the evaluation.
TEST(ResumeTest, PauseDuringTheEvaluationSectionReportsTheTrainedStep) {
  const Fixture f = MakeFixture("suite_pause");
  JobConfig job = MakeSpec(f);
  const std::string root = fs::path(f.model_dir).parent_path().string();
  testing::WriteInputIdsJsonl(root + "/val.jsonl", testing::RandomDocs(3, 30, 40, 61, 23));
  job.data.validation = root + "/val.jsonl";
  job.evaluation.suites = {EvalSuite::kPositions};
  job.evaluation.every_steps = 2;
  job.evaluation.lengths = {job.data.max_seq_len};
  auto run = [&](const std::string& dir, int pause_at) {
    std::vector<int64_t> reported;
    int polls = 0;
    RunOptions options;
    options.files = FileAccess::Unconfined();
    options.checkpoint_dir = testing::MakeDirs(dir);
    options.devices = {"cpu"};
    options.on_step = [&](const StepReport& p) { reported.push_back(p.evaluation.has_value() ? -p.step : p.step); };
    options.poll_stop = [&] {
      if (reported.size() == 1) ++polls;
      return reported.size() == 1 && polls == pause_at ? StopRequest::kPause : StopRequest::kNone;
    };
    auto r = RunJob(job, options);
    EXPECT_TRUE(r.ok()) << r.status();
    return std::make_tuple(r.ok() ? r->outcome : RunOutcome::kCancelled, polls, reported);
  };
  const auto [outcome, step2_polls, evaluated] = run(root + "/count", 0);
  ASSERT_EQ(outcome, RunOutcome::kSucceeded);
  ASSERT_EQ(evaluated.at(1), -2);  // step 2 ran the suite
  const auto [paused, polls, reported] = run(root + "/ckpt", step2_polls);
  EXPECT_EQ(paused, RunOutcome::kPaused);
  EXPECT_THAT(reported, ::testing::ElementsAre(1, 2));  // step 2 told, without its evaluation
  EXPECT_TRUE(fs::exists(root + "/ckpt/checkpoint-2"));
  std::ifstream log(root + "/ckpt/metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(log, line);) ++lines;
  EXPECT_EQ(lines, 2);
}

}  // namespace
}  // namespace oomb
