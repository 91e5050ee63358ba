// Tests of the job spec parser: defaults, every error class with its line, overrides, the
// round trip through YAML, and the file checks.
#include "worker/job/job_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace oomb {
namespace {

using ::testing::HasSubstr;

constexpr char kMinimal[] = R"(model:
  path: /models/m
data:
  train: /data/t.jsonl
)";

JobSpec ParseOk(const std::string& yaml) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(yaml, "job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : JobSpec();
}

// Parses `yaml` expecting INVALID_ARGUMENT and returns the message.
std::string ParseError(const std::string& yaml) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecYaml(yaml, "job.yaml");
  EXPECT_FALSE(spec.ok()) << yaml;
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

TEST(JobSpecTest, DefaultsMatchJobspecMd) {
  const JobSpec s = ParseOk(kMinimal);
  EXPECT_EQ(s.model.path, "/models/m");
  EXPECT_EQ(s.model.dtype, "bfloat16");
  EXPECT_FALSE(s.model.rope_scaling.has_value());
  EXPECT_EQ(s.method.type, "lora");
  EXPECT_EQ(s.method.lora.rank, 16);
  EXPECT_EQ(s.method.lora.alpha, 32);
  EXPECT_EQ(s.method.lora.dropout, 0.0);
  EXPECT_THAT(s.method.lora.target_modules,
              ::testing::ElementsAre("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"));
  EXPECT_EQ(s.data.validation, "");
  EXPECT_EQ(s.data.max_seq_len, 131072);
  EXPECT_TRUE(s.data.packing);
  EXPECT_EQ(s.data.too_long, "truncate");
  EXPECT_EQ(s.data.shuffle_seed, 0);
  EXPECT_EQ(s.training.max_steps, 100);
  EXPECT_EQ(s.training.epochs, 0);
  EXPECT_EQ(s.training.batch_sequences, 1);
  EXPECT_DOUBLE_EQ(s.training.learning_rate, 2e-4);
  EXPECT_EQ(s.training.lr_schedule, "cosine");
  EXPECT_EQ(s.training.warmup_steps, 10);
  EXPECT_EQ(s.training.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(s.training.adam.beta1, 0.9);
  EXPECT_DOUBLE_EQ(s.training.adam.beta2, 0.999);
  EXPECT_DOUBLE_EQ(s.training.adam.eps, 1e-8);
  EXPECT_DOUBLE_EQ(s.training.max_grad_norm, 1.0);
  EXPECT_EQ(s.training.seed, 42);
  EXPECT_EQ(s.training.eval_every_steps, 0);
  EXPECT_EQ(s.memory.chunk_tokens, 4096);
  EXPECT_EQ(s.memory.page_tokens, 128);
  EXPECT_EQ(s.memory.kv_offload, "auto");
  EXPECT_EQ(s.memory.kv_grad_dtype, "float32");
  EXPECT_EQ(s.attention.mode, "dense");
  EXPECT_EQ(s.attention.sparse.page_budget, 64);
  EXPECT_EQ(s.attention.sparse.sink_pages, 1);
  EXPECT_EQ(s.attention.sparse.local_pages, 4);
  EXPECT_EQ(s.attention.sparse.selection, "mean_key");
  EXPECT_EQ(s.backward.chunk_fraction, 1.0);
  EXPECT_EQ(s.checkpoint.every_steps, 50);
  EXPECT_EQ(s.checkpoint.keep_last, 3);
  EXPECT_EQ(s.checkpoint.dir, "");
  EXPECT_EQ(s.resources.device, "auto");
  EXPECT_EQ(s.resources.gpus, 1);
  EXPECT_EQ(s.resources.priority, 0);
  EXPECT_EQ(s.resources.max_retries, 2);
  EXPECT_EQ(s.resources.max_runtime_seconds, 0);
  // The parsed minimal document equals a default-constructed spec with the two paths set.
  JobSpec expected;
  expected.model.path = "/models/m";
  expected.data.train = "/data/t.jsonl";
  EXPECT_EQ(s, expected);
}

TEST(JobSpecTest, FullJobspecMdExampleParses) {
  const JobSpec s = ParseOk(R"(display_name: austen-longctx-lora
labels: {team: nlp}
model:
  path: /models/SmolLM2-135M-Instruct
  dtype: bfloat16
  rope_scaling: {type: yarn, factor: 8.0, original_max_position_embeddings: 8192}
method:
  type: lora
  lora: {rank: 8, alpha: 16, dropout: 0.05, target_modules: [q_proj, v_proj]}
data:
  train: /data/austen.jsonl
  validation: null
  max_seq_len: 2147483648
  packing: false
  too_long: drop
  shuffle_seed: -3
training:
  max_steps: 7
  batch_sequences: 2
  learning_rate: 1.0e-3
  lr_schedule: linear
  warmup_steps: 0
  weight_decay: 0.01
  adam: {beta1: 0.8, beta2: 0.99, eps: 1.0e-6}
  max_grad_norm: 0
  seed: 1
  eval_every_steps: 5
memory: {chunk_tokens: 1024, page_tokens: 128, kv_offload: host, kv_grad_dtype: bfloat16}
attention:
  mode: sparse
  sparse: {page_budget: 8, sink_pages: 1, local_pages: 7, selection: min_max}
backward: {chunk_fraction: 0.5}
checkpoint: {every_steps: 0, keep_last: 1, dir: /ckpt}
resources: {device: "cuda:1", gpus: 1, priority: -5, max_retries: 0, max_runtime_seconds: 3600}
)");
  EXPECT_EQ(s.display_name, "austen-longctx-lora");
  EXPECT_EQ(s.labels.at("team"), "nlp");
  ASSERT_TRUE(s.model.rope_scaling.has_value());
  EXPECT_EQ(s.model.rope_scaling->type, "yarn");
  EXPECT_EQ(s.model.rope_scaling->factor, 8.0);
  EXPECT_EQ(s.model.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(s.method.lora.target_modules.size(), 2u);
  EXPECT_EQ(s.data.max_seq_len, int64_t{1} << 31);
  EXPECT_FALSE(s.data.packing);
  EXPECT_EQ(s.data.shuffle_seed, -3);
  EXPECT_EQ(s.memory.chunk_tokens, 1024);
  EXPECT_EQ(s.attention.sparse.selection, "min_max");
  EXPECT_EQ(s.backward.chunk_fraction, 0.5);
  EXPECT_EQ(s.checkpoint.dir, "/ckpt");
  EXPECT_EQ(s.resources.device, "cuda:1");
  EXPECT_EQ(s.resources.priority, -5);
}

// Found by tests/fuzz/fuzz_job_spec: a path with bytes that are not UTF-8 was accepted, and
// could not round-trip (nor become a protobuf string).
TEST(JobSpecTest, TextFieldsAreUtf8WithoutControlCharacters) {
  EXPECT_THAT(ParseError("model: {path: \"/m\\x01\"}\ndata: {train: /t.jsonl}\n"),
              HasSubstr("model.path: contains a control character (at byte 2)"));
  EXPECT_THAT(ParseError(std::string(kMinimal) + "display_name: a\xff" + "b\n"),
              HasSubstr("display_name: is not valid UTF-8"));
  EXPECT_THAT(ParseError(std::string(kMinimal) + "labels: {team: \"x\\ty\"}\n"),
              HasSubstr("labels: contains a control character"));
  EXPECT_EQ(ParseOk(std::string(kMinimal) + "display_name: \"Émile — 長文\"\n").display_name, "Émile — 長文");
}

// Absurd values are refused naming the field and the allowed range (issue 11).
TEST(JobSpecTest, AbsurdValuesAreRefusedNamingTheField) {
  EXPECT_THAT(ParseError("model: {path: /m}\ndata: {train: /t.jsonl, max_seq_len: 1000000000000}\n"),
              HasSubstr("data.max_seq_len"));
  EXPECT_THAT(ParseError(std::string(kMinimal) + "method: {lora: {rank: 0}}\n"), HasSubstr("method.lora.rank"));
  EXPECT_THAT(ParseError(std::string(kMinimal) + "training: {learning_rate: -0.1}\n"),
              HasSubstr("training.learning_rate: must be > 0"));
  EXPECT_THAT(ParseError(std::string(kMinimal) + "memory: {chunk_tokens: -4096}\n"), HasSubstr("memory.chunk_tokens"));
}

TEST(JobSpecTest, EpochsReplaceDefaultMaxSteps) {
  const JobSpec s = ParseOk(std::string(kMinimal) + "training: {epochs: 2}\n");
  EXPECT_EQ(s.training.epochs, 2);
  EXPECT_EQ(s.training.max_steps, 0);
  EXPECT_THAT(ParseError(std::string(kMinimal) + "training:\n  max_steps: 5\n  epochs: 2\n"),
              HasSubstr("job.yaml:7: training.epochs: cannot be combined with training.max_steps"));
}

TEST(JobSpecTest, NullMeansDefault) {
  const JobSpec s =
      ParseOk(std::string(kMinimal) + "training: {max_steps: null, adam: null}\ncheckpoint: {dir: null}\n");
  EXPECT_EQ(s.training.max_steps, 100);
  EXPECT_DOUBLE_EQ(s.training.adam.beta1, 0.9);
  EXPECT_EQ(s.checkpoint.dir, "");
}

TEST(JobSpecTest, UnknownKeyNamesLineAndPathAndKnownKeys) {
  const std::string msg = ParseError("model:\n  path: /m\n  dtpye: float32\ndata: {train: /t}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:3: model.dtpye: unknown key"));
  EXPECT_THAT(msg, HasSubstr("path, dtype, rope_scaling"));
  EXPECT_THAT(ParseError(std::string(kMinimal) + "trainig: {}\n"), HasSubstr("job.yaml:5: trainig: unknown key"));
  EXPECT_THAT(ParseError(std::string(kMinimal) + "attention:\n  sparse:\n    budget: 3\n"),
              HasSubstr("job.yaml:7: attention.sparse.budget: unknown key"));
}

TEST(JobSpecTest, WrongTypesNameLineAndPath) {
  EXPECT_THAT(ParseError(std::string(kMinimal) + "training:\n  max_steps: many\n"),
              HasSubstr("job.yaml:6: training.max_steps: expected an integer, got 'many'"));
  EXPECT_THAT(ParseError(std::string(kMinimal) + "training:\n  max_steps: 2.5\n"),
              HasSubstr("job.yaml:6: training.max_steps: expected an integer"));
  EXPECT_THAT(ParseError(std::string(kMinimal) + "training:\n  max_steps: \"5\"\n"),
              HasSubstr("job.yaml:6: training.max_steps: expected an integer, got the string \"5\""));
  EXPECT_THAT(ParseError(std::string(kMinimal) + "training:\n  learning_rate: fast\n"),
              HasSubstr("job.yaml:6: training.learning_rate: expected a finite number"));
  EXPECT_THAT(ParseError(std::string(kMinimal) + "training:\n  learning_rate: .nan\n"),
              HasSubstr("job.yaml:6: training.learning_rate: expected a finite number"));
  EXPECT_THAT(ParseError("model:\n  path: /m\ndata:\n  train: /t\n  packing: maybe\n"),
              HasSubstr("job.yaml:5: data.packing: expected true or false"));
  EXPECT_THAT(ParseError(std::string(kMinimal) + "method:\n  lora:\n    target_modules: q_proj\n"),
              HasSubstr("job.yaml:7: method.lora.target_modules: expected a list of strings"));
  EXPECT_THAT(ParseError(std::string(kMinimal) + "training: 5\n"),
              HasSubstr("job.yaml:5: training: expected a mapping"));
  EXPECT_THAT(ParseError(std::string(kMinimal) + "labels: [a]\n"), HasSubstr("job.yaml:5: labels: expected a mapping"));
  EXPECT_THAT(ParseError(std::string(kMinimal) + "resources:\n  gpus: 9999999999\n"),
              HasSubstr("job.yaml:6: resources.gpus: must fit in 32 bits"));
  EXPECT_THAT(ParseError("- a\n- b\n"), HasSubstr("job.yaml: expected a mapping at the top level"));
}

TEST(JobSpecTest, OutOfRangeValuesNameLineAndPath) {
  struct Case {
    std::string yaml;  // appended to kMinimal, so it starts at line 5
    std::string want;
  };
  const Case cases[] = {
      {"training:\n  learning_rate: -1\n", "job.yaml:6: training.learning_rate: must be > 0, got -1"},
      {"training:\n  learning_rate: 0\n", "job.yaml:6: training.learning_rate: must be > 0, got 0"},
      {"method:\n  lora:\n    rank: 0\n", "job.yaml:7: method.lora.rank: must be > 0, got 0"},
      {"method:\n  lora:\n    rank: -3\n", "job.yaml:7: method.lora.rank: must be > 0, got -3"},
      {"method:\n  lora:\n    dropout: 1\n", "job.yaml:7: method.lora.dropout: must be in [0, 1), got 1"},
      {"training:\n  batch_sequences: -2\n", "job.yaml:6: training.batch_sequences: must be > 0, got -2"},
      {"training:\n  max_steps: -1\n", "job.yaml:6: training.max_steps: must be >= 0, got -1"},
      {"training:\n  max_steps: 0\n", "job.yaml:6: training.max_steps: must be > 0 (or set training.epochs)"},
      {"memory:\n  chunk_tokens: 0\n", "job.yaml:6: memory.chunk_tokens: must be > 0, got 0"},
      {"memory:\n  page_tokens: -128\n", "job.yaml:6: memory.page_tokens: must be > 0, got -128"},
      {"memory:\n  kv_offload: disk\n", "job.yaml:6: memory.kv_offload: must be one of auto, none, host; got 'disk'"},
      {"backward:\n  chunk_fraction: 0\n", "job.yaml:6: backward.chunk_fraction: must be in (0, 1], got 0"},
      {"backward:\n  chunk_fraction: 1.5\n", "job.yaml:6: backward.chunk_fraction: must be in (0, 1], got 1.5"},
      {"checkpoint:\n  keep_last: 0\n", "job.yaml:6: checkpoint.keep_last: must be > 0, got 0"},
      {"resources:\n  device: gpu\n", "job.yaml:6: resources.device: must be auto, cpu, cuda or cuda:N; got 'gpu'"},
      {"resources:\n  device: cuda:x\n", "job.yaml:6: resources.device: must be auto"},
      {"resources:\n  max_retries: -1\n", "job.yaml:6: resources.max_retries: must be >= 0, got -1"},
      {"training:\n  adam: {beta2: 1.0}\n", "job.yaml:6: training.adam.beta2: must be in [0, 1), got 1"},
      {"attention:\n  sparse: {page_budget: 4, sink_pages: 1, local_pages: 4}\n",
       "job.yaml:6: attention.sparse.page_budget: must be >= sink_pages + local_pages (5), got 4"},
      // Dense mode takes any chunk size; sparse needs chunks that start on page boundaries.
      {"memory: {chunk_tokens: 1000}\nattention: {mode: sparse}\n",
       "job.yaml:5: memory.chunk_tokens: must be a multiple of memory.page_tokens (128) with attention.mode: sparse"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ParseError(std::string(kMinimal) + c.yaml), HasSubstr(c.want)) << c.yaml;
  }
  // max_seq_len > 2^31, on its own line inside data.
  EXPECT_THAT(ParseError("model: {path: /m}\ndata:\n  train: /t\n  max_seq_len: 2147483649\n"),
              HasSubstr("job.yaml:4: data.max_seq_len: must be in (0, 2147483648], got 2147483649"));
  EXPECT_THAT(ParseError("model:\n  path: /m\n  dtype: fp16\ndata: {train: /t}\n"),
              HasSubstr("job.yaml:3: model.dtype: must be one of bfloat16, float32; got 'fp16'"));
}

TEST(JobSpecTest, RopeScalingNeedsType) {
  EXPECT_THAT(ParseError("model:\n  path: /m\n  rope_scaling: {factor: 8}\ndata: {train: /t}\n"),
              HasSubstr("job.yaml:3: model.rope_scaling.type: is required"));
  EXPECT_THAT(ParseError("model:\n  path: /m\n  rope_scaling: {type: ntk}\ndata: {train: /t}\n"),
              HasSubstr("job.yaml:3: model.rope_scaling.type: must be one of linear, dynamic, yarn, llama3"));
}

TEST(JobSpecTest, MissingRequiredFields) {
  EXPECT_THAT(ParseError("data: {train: /t}\n"), HasSubstr("job.yaml: model.path: is required"));
  EXPECT_THAT(ParseError("model: {path: /m}\n"), HasSubstr("job.yaml: data.train: is required"));
  EXPECT_THAT(ParseError(""), HasSubstr("model.path: is required"));
}

TEST(JobSpecTest, SyntaxErrorAndDuplicateKeyNameTheLine) {
  EXPECT_THAT(ParseError("model:\n  path: /m\n  dtype: [unclosed\n"), HasSubstr("job.yaml:"));
  EXPECT_THAT(ParseError("model:\n  path: /m\n  path: /n\ndata: {train: /t}\n"),
              HasSubstr("job.yaml:3: model.path: duplicate key"));
}

TEST(JobSpecTest, EmptySourceNameGivesBarePath) {
  absl::StatusOr<JobSpec> s = ParseJobSpecYaml(std::string(kMinimal) + "training: {learning_rate: -1}\n", "");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(), "training.learning_rate: must be > 0, got -1");
}

TEST(JobSpecTest, Override) {
  JobSpec s = ParseOk(kMinimal);
  ASSERT_TRUE(ApplyOverride(&s, "training.max_steps=5").ok());
  EXPECT_EQ(s.training.max_steps, 5);
  ASSERT_TRUE(ApplyOverride(&s, "method.lora.target_modules=[q_proj, v_proj]").ok());
  EXPECT_THAT(s.method.lora.target_modules, ::testing::ElementsAre("q_proj", "v_proj"));
  ASSERT_TRUE(ApplyOverride(&s, "labels.team=nlp").ok());
  EXPECT_EQ(s.labels.at("team"), "nlp");
  ASSERT_TRUE(ApplyOverride(&s, "labels.team=null").ok());
  EXPECT_TRUE(s.labels.empty());
  ASSERT_TRUE(ApplyOverride(&s, "model.rope_scaling={type: linear, factor: 2}").ok());
  ASSERT_TRUE(s.model.rope_scaling.has_value());
  EXPECT_EQ(s.model.rope_scaling->factor, 2);
  ASSERT_TRUE(ApplyOverride(&s, "model.rope_scaling.factor=4").ok());
  EXPECT_EQ(s.model.rope_scaling->factor, 4);
  ASSERT_TRUE(ApplyOverride(&s, "model.rope_scaling=null").ok());
  EXPECT_FALSE(s.model.rope_scaling.has_value());
  ASSERT_TRUE(ApplyOverride(&s, "data.validation=/v.jsonl").ok());
  EXPECT_EQ(s.data.validation, "/v.jsonl");
  ASSERT_TRUE(ApplyOverride(&s, "training.epochs=3").ok());
  EXPECT_EQ(s.training.epochs, 3);
  EXPECT_EQ(s.training.max_steps, 0);
  ASSERT_TRUE(ApplyOverride(&s, "training.max_steps=9").ok());
  EXPECT_EQ(s.training.epochs, 0);
  EXPECT_EQ(s.training.max_steps, 9);
  ASSERT_TRUE(ApplyOverride(&s, "display_name=a=b").ok());  // the first '=' splits
  EXPECT_EQ(s.display_name, "a=b");
  EXPECT_TRUE(ValidateJobSpec(s).ok());
}

TEST(JobSpecTest, OverrideErrorsLeaveSpecUnchanged) {
  JobSpec s = ParseOk(kMinimal);
  const JobSpec before = s;
  absl::Status st = ApplyOverride(&s, "training.learning_rate=-1");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "--set training.learning_rate=-1: training.learning_rate: must be > 0, got -1");
  EXPECT_THAT(ApplyOverride(&s, "training.max_stepz=5").message(),
              HasSubstr("--set training.max_stepz=5: training.max_stepz: unknown key (known keys under training:"));
  EXPECT_THAT(ApplyOverride(&s, "training.max_steps=five").message(), HasSubstr("expected an integer"));
  EXPECT_THAT(ApplyOverride(&s, "training.max_steps").message(), HasSubstr("expected key=value"));
  EXPECT_THAT(ApplyOverride(&s, "model.rope_scaling.factor=2").message(),
              HasSubstr("model.rope_scaling.type: is required"));
  EXPECT_THAT(ApplyOverride(&s, "training={learning_rate: 0}").message(),
              HasSubstr("training.learning_rate: must be > 0"));
  EXPECT_EQ(s, before);
}

TEST(JobSpecTest, RoundTripDefaultsAndEverythingSet) {
  JobSpec a = ParseOk(kMinimal);
  EXPECT_EQ(ParseOk(JobSpecToYaml(a)), a);

  JobSpec b = a;
  b.display_name = "null";  // strings that read as YAML specials must survive
  b.labels = {{"team", "nlp"}, {"empty", ""}, {"n", "123"}};
  b.model.dtype = "float32";
  b.model.rope_scaling = RopeScalingSpec{.type = "llama3",
                                         .factor = 8,
                                         .original_max_position_embeddings = 8192,
                                         .low_freq_factor = 1,
                                         .high_freq_factor = 4,
                                         .beta_fast = 0,
                                         .beta_slow = 0};
  b.method.type = "full";
  b.method.lora.alpha = 0.1 + 0.2;  // not exactly representable in short decimal
  b.method.lora.target_modules = {"q_proj", "true"};
  b.data.validation = "/v.jsonl";
  b.data.packing = false;
  b.training.epochs = 2;
  b.training.max_steps = 0;
  b.training.learning_rate = 3.3e-5;
  b.training.adam.eps = 1e-12;
  b.memory.chunk_tokens = 1024;
  b.attention.mode = "sparse";
  b.backward.chunk_fraction = 0.25;
  b.checkpoint.dir = "/c: d";
  b.resources.device = "cuda:3";
  b.resources.priority = -7;
  ASSERT_TRUE(ValidateJobSpec(b).ok()) << ValidateJobSpec(b);
  const std::string yaml = JobSpecToYaml(b);
  EXPECT_EQ(ParseOk(yaml), b) << yaml;
  EXPECT_EQ(JobSpecToYaml(ParseOk(yaml)), yaml);
}

TEST(JobSpecTest, ValidateJobSpecWithoutSource) {
  JobSpec s;
  EXPECT_EQ(ValidateJobSpec(s).message(), "model.path: is required");
  s.model.path = "/m";
  s.data.train = "/t";
  EXPECT_TRUE(ValidateJobSpec(s).ok());
  s.memory.kv_grad_dtype = "";
  EXPECT_THAT(ValidateJobSpec(s).message(), HasSubstr("memory.kv_grad_dtype: must be one of float32, bfloat16"));
}

}  // namespace
}  // namespace oomb
