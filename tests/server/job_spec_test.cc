// The job spec from YAML to the engine's JobConfig, as `oombd run` and the daemon read it: the
// schema's defaults and checks (proto/spec) with file:line, the checks that relate fields
// (server/job_spec.h), and input whose meaning used to change silently (issue 36, item 8).
#include "server/job_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <google/protobuf/unknown_field_set.h>

#include <iterator>
#include <limits>
#include <string>

#include "oomb/v1/rules.pb.h"
#include "server/legacy_fields.h"
#include "worker/common/status.h"
#include "worker/hf/lora_limits.h"

namespace oomb::server {
namespace {

using ::testing::HasSubstr;

constexpr char kMinimal[] = R"(model:
  path: /models/m
data:
  train: /data/t.jsonl
)";

// YAML -> proto (checked) -> JobConfig, naming "job.yaml".
absl::StatusOr<JobConfig> Load(const std::string& yaml, v1::JobSpec* out = nullptr) {
  v1::JobSpec spec;
  spec::Lines lines;
  const spec::Source source{"job.yaml", ""};
  absl::Status s = spec::ParseYaml(yaml, source, &spec, &lines);
  if (!s.ok()) return s;
  absl::StatusOr<JobConfig> c = ResolveJobSpec(&spec, source, &lines);
  if (out != nullptr) *out = spec;
  return c;
}

JobConfig LoadOk(const std::string& yaml) {
  absl::StatusOr<JobConfig> c = Load(yaml);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : JobConfig();
}

std::string LoadError(const std::string& yaml) {
  absl::StatusOr<JobConfig> c = Load(yaml);
  EXPECT_FALSE(c.ok()) << yaml;
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  return std::string(c.status().message());
}

// One bound, set by the proto: the job spec's rules for method.lora, and the numbers the engine
// checks the rank and alpha of an adapter_config.json against (worker/hf/lora_limits.h; and
// JobConfig's, until the model reads lora_limits.h).
TEST(JobSpecTest, LoraBoundsAreTheEnginesBoundsForAdapterFiles) {
  const auto rules = [](const char* name) {
    return v1::LoraSpec::descriptor()->FindFieldByName(name)->options().GetExtension(v1::rules);
  };
  EXPECT_EQ(rules("rank").max(), kMaxLoraRank);
  EXPECT_EQ(rules("alpha").max(), kMaxLoraAlpha);
}

TEST(JobSpecTest, DefaultsMatchTheDocumentedOnes) {
  const JobConfig s = LoadOk(kMinimal);
  EXPECT_EQ(s.model.path, "/models/m");
  EXPECT_EQ(s.model.dtype, ModelDtype::kBFloat16);
  EXPECT_FALSE(s.model.rope_scaling.has_value());
  EXPECT_FALSE(s.model.router_aux_loss_coef.has_value());  // config.json's
  EXPECT_EQ(s.method.type, TrainMethod::kLora);
  EXPECT_EQ(s.method.lora.rank, 16);
  EXPECT_EQ(s.method.lora.alpha, 32);
  EXPECT_EQ(s.method.lora.dropout, 0.0);
  EXPECT_THAT(s.method.lora.target_modules,
              ::testing::ElementsAre("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"));
  EXPECT_EQ(s.data.validation, "");
  EXPECT_EQ(s.data.max_seq_len, 131072);
  EXPECT_TRUE(s.data.packing);
  EXPECT_EQ(s.data.too_long, TooLong::kTruncate);
  EXPECT_EQ(s.data.shuffle_seed, 0);
  EXPECT_EQ(s.training.max_steps, 100);
  EXPECT_EQ(s.training.epochs, 0);
  EXPECT_EQ(s.training.batch_sequences, 1);
  EXPECT_DOUBLE_EQ(s.training.learning_rate, 2e-4);
  EXPECT_EQ(s.training.lr_schedule, LrSchedule::kCosine);
  EXPECT_EQ(s.training.warmup_steps, 10);
  EXPECT_EQ(s.training.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(s.training.beta1, 0.9);
  EXPECT_DOUBLE_EQ(s.training.beta2, 0.999);
  EXPECT_DOUBLE_EQ(s.training.eps, 1e-8);
  EXPECT_DOUBLE_EQ(s.training.max_grad_norm, 1.0);
  EXPECT_EQ(s.training.seed, 42);
  EXPECT_EQ(s.training.eval_every_steps, 0);
  EXPECT_EQ(s.memory.chunk_tokens, 0);   // auto: the memory planner's choice
  EXPECT_EQ(s.memory.page_tokens, 128);  // auto, dense attention
  EXPECT_TRUE(s.choices.empty());
  EXPECT_TRUE(s.memory.swap_attention);
  EXPECT_EQ(s.memory.kv_offload, KvOffload::kAuto);
  EXPECT_EQ(s.memory.kv_grad_dtype, KvGradDtype::kAuto);  // the memory planner's choice
  EXPECT_FALSE(s.sparse.has_value());
  EXPECT_EQ(s.chunk_fraction, 1.0);
  EXPECT_EQ(s.checkpoint.every_steps, 50);
  EXPECT_EQ(s.checkpoint.keep_last, 3);
  EXPECT_EQ(s.checkpoint.dir, "");
  EXPECT_EQ(s.resources.device, "auto");
  EXPECT_EQ(s.resources.gpus, 1);
  EXPECT_EQ(s.resources.priority, 0);
  EXPECT_EQ(s.resources.max_retries, 2);
  EXPECT_EQ(s.resources.max_runtime_seconds, 0);
  const JobConfig sparse = LoadOk(std::string(kMinimal) + "attention: {mode: sparse}\n");
  ASSERT_TRUE(sparse.sparse.has_value());
  // auto with sparse attention: pages of 256, 32 of them (8,192 keys a query tile), said why.
  EXPECT_EQ(sparse.memory.page_tokens, 256);
  EXPECT_EQ(sparse.sparse->page_budget, 32);
  ASSERT_EQ(sparse.choices.size(), 2u);
  EXPECT_THAT(sparse.choices[0], HasSubstr("memory.page_tokens auto: 256 with attention.mode sparse"));
  EXPECT_THAT(sparse.choices[1], HasSubstr("attention.sparse.page_budget auto: 32 pages of 256 tokens"));
  // A page size given: the budget still covers 8,192 keys; a budget given stays.
  const JobConfig pages128 = LoadOk(std::string(kMinimal) + "memory: {page_tokens: 128}\nattention: {mode: sparse}\n");
  EXPECT_EQ(pages128.sparse->page_budget, 64);
  const JobConfig budget8 = LoadOk(std::string(kMinimal) + "attention: {mode: sparse, sparse: {page_budget: 8}}\n");
  EXPECT_EQ(budget8.memory.page_tokens, 256);
  EXPECT_EQ(budget8.sparse->page_budget, 8);
  EXPECT_EQ(sparse.sparse->sink_pages, 1);
  EXPECT_EQ(sparse.sparse->local_pages, 4);
  EXPECT_EQ(sparse.sparse->selection, PageSummaryKind::kMeanKey);
}

TEST(JobSpecTest, AFullExampleParses) {
  const JobConfig s = LoadOk(R"(display_name: austen-longctx-lora
labels: {team: nlp}
model:
  path: /models/SmolLM2-135M-Instruct
  dtype: bfloat16
  rope_scaling: {type: yarn, factor: 8.0, original_max_position_embeddings: 8192}
  router_aux_loss_coef: 0.01
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
  validation_max_tokens: 4096
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
memory: {chunk_tokens: 1024, page_tokens: 128, kv_offload: host, kv_grad_dtype: bfloat16, swap_attention: false}
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
  EXPECT_EQ(s.model.rope_scaling->type, RopeType::kYarn);
  EXPECT_EQ(s.model.rope_scaling->factor, 8.0);
  EXPECT_EQ(s.model.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(s.model.router_aux_loss_coef, 0.01);
  EXPECT_EQ(s.method.lora.target_modules.size(), 2u);
  EXPECT_EQ(s.data.max_seq_len, int64_t{1} << 31);
  EXPECT_FALSE(s.data.packing);
  EXPECT_EQ(s.data.too_long, TooLong::kDrop);
  EXPECT_EQ(s.data.shuffle_seed, -3);
  EXPECT_EQ(s.data.validation_max_tokens, 4096);
  EXPECT_EQ(s.training.lr_schedule, LrSchedule::kLinear);
  EXPECT_EQ(s.memory.chunk_tokens, 1024);
  EXPECT_EQ(s.memory.kv_offload, KvOffload::kHost);
  EXPECT_EQ(s.memory.kv_grad_dtype, KvGradDtype::kBFloat16);
  EXPECT_FALSE(s.memory.swap_attention);
  ASSERT_TRUE(s.sparse.has_value());
  EXPECT_EQ(s.sparse->selection, PageSummaryKind::kMinMax);
  EXPECT_EQ(s.chunk_fraction, 0.5);
  EXPECT_EQ(s.checkpoint.dir, "/ckpt");
  EXPECT_EQ(s.resources.device, "cuda:1");
  EXPECT_EQ(s.resources.priority, -5);
}

// Found by tests/fuzz/fuzz_job_spec: text that is not UTF-8 could not become a protobuf string.
TEST(JobSpecTest, TextFieldsAreUtf8WithoutControlCharacters) {
  EXPECT_THAT(LoadError("model: {path: \"/m\\x01\"}\ndata: {train: /t.jsonl}\n"),
              HasSubstr("model.path: contains a control character (at byte 2)"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "display_name: a\xff" + "b\n"),
              HasSubstr("display_name: is not valid UTF-8"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "labels: {team: \"x\\ty\"}\n"),
              HasSubstr("labels.team: contains a control character"));
  EXPECT_EQ(LoadOk(std::string(kMinimal) + "display_name: \"Émile — 長文\"\n").display_name, "Émile — 長文");
  // A path in bytes that are not UTF-8 (legal on Linux) cannot travel in the API: named, not a crash.
  EXPECT_THAT(LoadError("model: {path: /m\xe9}\ndata: {train: /t}\n"),
              HasSubstr("job.yaml:1: model.path: is not valid UTF-8"));
}

// Absurd values are refused naming the field and the allowed range (issue 11).
TEST(JobSpecTest, AbsurdValuesAreRefusedNamingTheField) {
  EXPECT_THAT(LoadError("model: {path: /m}\ndata: {train: /t.jsonl, max_seq_len: 1000000000000}\n"),
              HasSubstr("data.max_seq_len"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "method: {lora: {rank: 0}}\n"), HasSubstr("method.lora.rank"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "training: {learning_rate: -0.1}\n"),
              HasSubstr("training.learning_rate: must be in (0, 10]"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "memory: {chunk_tokens: -4096}\n"), HasSubstr("memory.chunk_tokens"));
}

// Issue 36, item 8: input whose meaning used to change silently is an error naming
// file:line:field.
TEST(JobSpecTest, InputWhoseMeaningWouldChangeIsRefused) {
  for (const char* v : {"nan", ".nan", "inf", "-.inf", ".Inf"}) {
    EXPECT_THAT(LoadError(std::string(kMinimal) + "training:\n  learning_rate: " + v + "\n"),
                HasSubstr("job.yaml:6: training.learning_rate:"))
        << v;
  }
  EXPECT_THAT(LoadError(std::string(kMinimal) + "training: {max_steps: 5}\ntraining: {learning_rate: 0.1}\n"),
              HasSubstr("job.yaml:6: training: duplicate key"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "---\nmodel: {path: /other}\n"), HasSubstr("a second YAML document"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "labels: {team: {name: nlp}}\n"),
              HasSubstr("job.yaml:5: labels.team: expected a single value, got a mapping"));
  EXPECT_THAT(LoadError("model:\n  path: /m\n  rope_scaling: {type: yarn, factor: 0}\ndata: {train: /t}\n"),
              HasSubstr("job.yaml:3: model.rope_scaling.factor: must be in (0, 1024], got 0"));
  EXPECT_THAT(LoadError("model:\n  path: /m\n  rope_scaling: {type: yarn}\ndata: {train: /t}\n"),
              HasSubstr("job.yaml:3: model.rope_scaling.factor: is required"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "memory:\n  page_tokens: 4611686018427387904\n"),
              HasSubstr("job.yaml:6: memory.page_tokens: must be in (0, 65536]"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "memory:\n  chunk_tokens: 4611686018427387904\n"),
              HasSubstr("job.yaml:6: memory.chunk_tokens: must be in (0, 1048576] or auto"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "memory:\n  chunk_tokens: automatic\n"),
              HasSubstr("job.yaml:6: memory.chunk_tokens: expected an integer or auto, got 'automatic'"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "display_name: " + std::string(300, 'x') + "\n"),
              HasSubstr("display_name: is longer than 256 bytes"));
}

TEST(JobSpecTest, EpochsReplaceTheDefaultMaxSteps) {
  const JobConfig s = LoadOk(std::string(kMinimal) + "training: {epochs: 2}\n");
  EXPECT_EQ(s.training.epochs, 2);
  EXPECT_EQ(s.training.max_steps, 0);
  EXPECT_THAT(LoadError(std::string(kMinimal) + "training:\n  max_steps: 5\n  epochs: 2\n"),
              HasSubstr("job.yaml:7: training.epochs: cannot be combined with training.max_steps"));
}

TEST(JobSpecTest, NullMeansDefault) {
  const JobConfig s =
      LoadOk(std::string(kMinimal) + "training: {max_steps: null, adam: null}\ncheckpoint: {dir: null}\n");
  EXPECT_EQ(s.training.max_steps, 100);
  EXPECT_DOUBLE_EQ(s.training.beta1, 0.9);
  EXPECT_EQ(s.checkpoint.dir, "");
}

TEST(JobSpecTest, UnknownKeyNamesLineAndPathAndKnownKeys) {
  const std::string msg = LoadError("model:\n  path: /m\n  dtpye: float32\ndata: {train: /t}\n");
  EXPECT_THAT(msg, HasSubstr("job.yaml:3: model.dtpye: unknown key"));
  EXPECT_THAT(msg, HasSubstr("path, dtype, rope_scaling"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "trainig: {}\n"), HasSubstr("job.yaml:5: trainig: unknown key"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "attention:\n  sparse:\n    budget: 3\n"),
              HasSubstr("job.yaml:7: attention.sparse.budget: unknown key"));
}

TEST(JobSpecTest, WrongTypesNameLineAndPath) {
  EXPECT_THAT(LoadError(std::string(kMinimal) + "training:\n  max_steps: many\n"),
              HasSubstr("job.yaml:6: training.max_steps: expected an integer, got 'many'"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "training:\n  max_steps: 2.5\n"),
              HasSubstr("job.yaml:6: training.max_steps: expected an integer"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "training:\n  max_steps: \"5\"\n"),
              HasSubstr("job.yaml:6: training.max_steps: expected an integer, got the string \"5\""));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "training:\n  learning_rate: fast\n"),
              HasSubstr("job.yaml:6: training.learning_rate: expected a finite number"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "training:\n  learning_rate: .nan\n"),
              HasSubstr("job.yaml:6: training.learning_rate: expected a finite number"));
  EXPECT_THAT(LoadError("model:\n  path: /m\ndata:\n  train: /t\n  packing: maybe\n"),
              HasSubstr("job.yaml:5: data.packing: expected true or false"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "method:\n  lora:\n    target_modules: q_proj\n"),
              HasSubstr("job.yaml:7: method.lora.target_modules: expected a list of strings"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "training: 5\n"),
              HasSubstr("job.yaml:5: training: expected a mapping"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "labels: [a]\n"), HasSubstr("job.yaml:5: labels: expected a mapping"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + "resources:\n  gpus: 9999999999\n"),
              HasSubstr("job.yaml:6: resources.gpus: must fit in 32 bits"));
  EXPECT_THAT(LoadError("- a\n- b\n"), HasSubstr("job.yaml: expected a mapping at the top level"));
}

TEST(JobSpecTest, OutOfRangeValuesNameLineAndPath) {
  struct Case {
    std::string yaml;  // appended to kMinimal, so it starts at line 5
    std::string want;
  };
  const Case cases[] = {
      {"training:\n  learning_rate: -1\n", "job.yaml:6: training.learning_rate: must be in (0, 10], got -1"},
      {"training:\n  learning_rate: 0\n", "job.yaml:6: training.learning_rate: must be in (0, 10], got 0"},
      {"method:\n  lora:\n    rank: 0\n", "job.yaml:7: method.lora.rank: must be in (0, 4096], got 0"},
      {"method:\n  lora:\n    rank: -3\n", "job.yaml:7: method.lora.rank: must be in (0, 4096], got -3"},
      {"method:\n  lora:\n    dropout: 1\n", "job.yaml:7: method.lora.dropout: must be in [0, 1), got 1"},
      {"training:\n  batch_sequences: -2\n", "job.yaml:6: training.batch_sequences: must be in (0, 65536], got -2"},
      {"training:\n  max_steps: -1\n", "job.yaml:6: training.max_steps: must be in (0, 1000000000], got -1"},
      {"training:\n  max_steps: 0\n", "job.yaml:6: training.max_steps: must be in (0, 1000000000], got 0"},
      {"memory:\n  chunk_tokens: -1\n", "job.yaml:6: memory.chunk_tokens: must be in (0, 1048576] or auto, got -1"},
      {"memory:\n  page_tokens: -128\n", "job.yaml:6: memory.page_tokens: must be in (0, 65536] or auto, got -128"},
      {"memory:\n  kv_offload: disk\n", "job.yaml:6: memory.kv_offload: must be one of auto, none, host; got 'disk'"},
      {"backward:\n  chunk_fraction: 0\n", "job.yaml:6: backward.chunk_fraction: must be in (0, 1], got 0"},
      {"backward:\n  chunk_fraction: 1.5\n", "job.yaml:6: backward.chunk_fraction: must be in (0, 1], got 1.5"},
      {"checkpoint:\n  keep_last: 0\n", "job.yaml:6: checkpoint.keep_last: must be in (0, 10000], got 0"},
      {"resources:\n  device: gpu\n", "job.yaml:6: resources.device: must be auto, cpu, cuda or cuda:N; got 'gpu'"},
      {"resources:\n  device: cuda:x\n", "job.yaml:6: resources.device: must be auto"},
      {"resources:\n  max_retries: -1\n", "job.yaml:6: resources.max_retries: must be in [0, 100], got -1"},
      {"training:\n  adam: {beta2: 1.0}\n", "job.yaml:6: training.adam.beta2: must be in [0, 1), got 1"},
      {"attention:\n  sparse: {page_budget: 4, sink_pages: 1, local_pages: 4}\n  mode: sparse\n",
       "job.yaml:6: attention.sparse.page_budget: must be >= sink_pages + local_pages (5), got 4"},
      // Dense mode takes any chunk size; sparse needs chunks that start on page boundaries.
      {"memory: {chunk_tokens: 1000}\nattention: {mode: sparse}\n",
       "job.yaml:5: memory.chunk_tokens: must be a multiple of memory.page_tokens (256) with attention.mode: sparse"},
      {"training: {batch_sequences: 1}\nresources: {gpus: 2}\n",
       "job.yaml:5: training.batch_sequences: must be >= resources.gpus / parallel.tensor (2)"},
      // Tensor parallelism: groups of parallel.tensor ranks, data-parallel between them.
      {"parallel: {tensor: 0}\n", "job.yaml:5: parallel.tensor: must be in [1, 8], got 0"},
      {"resources: {gpus: 4}\nparallel: {tensor: 3}\ntraining: {batch_sequences: 4}\n",
       "job.yaml:6: parallel.tensor: must divide resources.gpus (4): the ranks form groups of parallel.tensor; got 3"},
      {"resources: {gpus: 4}\nparallel: {tensor: 2}\ntraining: {batch_sequences: 1}\n",
       "job.yaml:7: training.batch_sequences: must be >= resources.gpus / parallel.tensor (2)"},
      {"resources: {gpus: 2}\nparallel: {tensor: 2}\nevaluation: {suites: [passkey]}\n",
       "evaluation.suites: the evaluation suites run on one device; with parallel.tensor 2 leave them out"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(LoadError(std::string(kMinimal) + c.yaml), HasSubstr(c.want)) << c.yaml;
  }
  EXPECT_THAT(LoadError("model: {path: /m}\ndata:\n  train: /t\n  max_seq_len: 2147483649\n"),
              HasSubstr("job.yaml:4: data.max_seq_len: must be in (0, 2147483648], got 2147483649"));
  EXPECT_THAT(LoadError("model:\n  path: /m\n  dtype: fp16\ndata: {train: /t}\n"),
              HasSubstr("job.yaml:3: model.dtype: must be one of bfloat16, float32; got 'fp16'"));
}

// notifications.webhooks: each endpoint's fields checked, an item named by its index.
TEST(JobSpecTest, WebhooksAreCheckedAndNamedByTheirIndex) {
  const std::string hooks =
      "notifications:\n  webhooks:\n    - {url: 'https://a.example/h', secret_file: /s/a, events: [job_failed]}\n";
  v1::JobSpec spec;
  ASSERT_TRUE(Load(std::string(kMinimal) + hooks, &spec).ok()) << LoadError(std::string(kMinimal) + hooks);
  ASSERT_EQ(spec.notifications().webhooks_size(), 1);
  EXPECT_EQ(spec.notifications().webhooks(0).events(0), v1::Notification::job_failed);
  EXPECT_THAT(LoadError(std::string(kMinimal) + hooks + "    - {url: 'ftp://b.example', secret_file: /s/b}\n"),
              HasSubstr("job.yaml:8: notifications.webhooks[1].url: must be an http:// or https:// URL; got "
                        "'ftp://b.example'"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + hooks + "    - {url: 'https://b.example'}\n"),
              HasSubstr("notifications.webhooks[1].secret_file: is required"));
  EXPECT_THAT(LoadError(std::string(kMinimal) + hooks + "    - {url: 'https://b', secret_file: /s, events: [done]}\n"),
              HasSubstr("must be one of"));
}

TEST(JobSpecTest, RopeScalingNeedsType) {
  EXPECT_THAT(LoadError("model:\n  path: /m\n  rope_scaling: {factor: 8}\ndata: {train: /t}\n"),
              HasSubstr("job.yaml:3: model.rope_scaling.type: is required"));
  EXPECT_THAT(LoadError("model:\n  path: /m\n  rope_scaling: {type: ntk}\ndata: {train: /t}\n"),
              HasSubstr("job.yaml:3: model.rope_scaling.type: must be one of linear, dynamic, yarn, llama3"));
}

// The suites' words are the proto enum's (job_spec.proto Evaluation.Suite), each way.
TEST(JobSpecTest, EvaluationSuitesAreTheProtoEnumsWords) {
  const google::protobuf::EnumDescriptor* proto = v1::Evaluation::Suite_descriptor();
  EXPECT_EQ(proto->value_count(), static_cast<int>(std::size(kEvalSuites)) + 1);  // + suite_unspecified
  for (const EvalSuite s : kEvalSuites) {
    ASSERT_NE(proto->FindValueByName(SuiteName(s)), nullptr) << SuiteName(s);
    EXPECT_EQ(SuiteNamed(SuiteName(s)), s);
  }
  EXPECT_EQ(SuiteNamed("suite_unspecified"), std::nullopt);
  // A number no suite has, as a client may send one, is refused naming the field.
  v1::JobSpec spec;
  spec.mutable_model()->set_path("/m");
  spec.mutable_data()->set_train("/t");
  spec.mutable_evaluation()->add_suites(static_cast<v1::Evaluation::Suite>(9));
  EXPECT_THAT(std::string(ResolveJobSpec(spec).status().message()), HasSubstr("evaluation.suites"));
}

// A client built against the proto before the suites became an enum sends them as strings in
// field 1 (now reserved): CreateJob reads them as the enum (server/legacy_fields.h) before the
// spec is resolved, and the effective spec holds the present form.
TEST(JobSpecTest, SuitesSentAsStringsByAnOlderClientAreRead) {
  v1::JobSpec spec;
  spec.mutable_model()->set_path("/m");
  spec.mutable_data()->set_train("/t");
  spec.mutable_data()->set_max_seq_len(4096);
  v1::EvaluationSpec* e = spec.mutable_evaluation();
  e->GetReflection()->MutableUnknownFields(e)->AddLengthDelimited(1, "passkey");
  v1::JobSpec wire;
  ASSERT_TRUE(wire.ParseFromString(spec.SerializeAsString()));  // as CreateJob receives it
  UpgradeLegacyFields(&wire);
  absl::StatusOr<JobConfig> c = ResolveJobSpec(&wire);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->evaluation.suites, std::vector<EvalSuite>{EvalSuite::kPasskey});
  ASSERT_EQ(wire.evaluation().suites_size(), 1);
  EXPECT_EQ(wire.evaluation().suites(0), v1::Evaluation::passkey);
  EXPECT_EQ(wire.evaluation().GetReflection()->GetUnknownFields(wire.evaluation()).field_count(), 0);
}

// The evaluation section: a list of suites and of lengths (each at most data.max_seq_len, by
// default max_seq_len itself), each suite's input required, errors naming the line.
TEST(JobSpecTest, EvaluationSectionSuitesLengthsAndTheirInputs) {
  const JobConfig plain = LoadOk(kMinimal);
  EXPECT_TRUE(plain.evaluation.suites.empty());
  const JobConfig e = LoadOk(
      "model: {path: /m}\ndata: {train: /t, validation: /v, max_seq_len: 8192}\n"
      "evaluation:\n  suites: [positions, passkey, needle]\n  every_steps: 50\n  lengths: [2048, 8192]\n"
      "  depths: 3\n  trials: 2\n  seed: 7\n  haystack: /book.txt\n");
  EXPECT_EQ(e.evaluation.suites,
            (std::vector<EvalSuite>{EvalSuite::kPositions, EvalSuite::kPasskey, EvalSuite::kNeedle}));
  EXPECT_EQ(e.evaluation.every_steps, 50);
  EXPECT_EQ(e.evaluation.lengths, (std::vector<int64_t>{2048, 8192}));
  EXPECT_EQ(e.evaluation.depths, 3);
  EXPECT_EQ(e.evaluation.trials, 2);
  EXPECT_EQ(e.evaluation.seed, 7u);
  EXPECT_EQ(e.evaluation.haystack, "/book.txt");
  const JobConfig d =
      LoadOk("model: {path: /m}\ndata: {train: /t, max_seq_len: 4096}\nevaluation: {suites: [passkey]}\n");
  EXPECT_EQ(d.evaluation.lengths, (std::vector<int64_t>{4096}));
  EXPECT_EQ(d.evaluation.depths, 5);

  EXPECT_THAT(LoadError("model: {path: /m}\ndata: {train: /t}\nevaluation:\n  suites: [perplexity]\n"),
              HasSubstr("job.yaml:4: evaluation.suites: must be one of positions, passkey, needle, ruler; got "
                        "'perplexity'"));
  EXPECT_THAT(LoadError("model: {path: /m}\ndata: {train: /t}\nevaluation:\n  suites: [positions]\n"),
              HasSubstr("evaluation.suites: positions scores data.validation: set it"));
  EXPECT_THAT(LoadError("model: {path: /m}\ndata: {train: /t}\nevaluation:\n  suites: [needle]\n"),
              HasSubstr("evaluation.haystack: required by the needle suite"));
  EXPECT_THAT(LoadError("model: {path: /m}\ndata: {train: /t, max_seq_len: 4096}\n"
                        "evaluation:\n  suites: [passkey]\n  lengths: [8192]\n"),
              HasSubstr("job.yaml:5: evaluation.lengths: each must be at most data.max_seq_len (4096"));
  EXPECT_THAT(LoadError("model: {path: /m}\ndata: {train: /t}\nevaluation:\n  suites: [passkey]\n  lengths: [0]\n"),
              HasSubstr("evaluation.lengths"));
}

// The ruler suite: RULER's tasks by RULER's names (default all 11), samples and threshold with
// RULER's defaults, the essay tasks' haystack required, errors naming the line.
TEST(JobSpecTest, RulerSuiteTasksSamplesThresholdAndItsHaystack) {
  const JobConfig all = LoadOk(
      "model: {path: /m}\ndata: {train: /t, max_seq_len: 8192}\n"
      "evaluation:\n  suites: [ruler]\n  lengths: [4096, 8192]\n  haystack: /essays.txt\n");
  EXPECT_EQ(all.evaluation.suites, std::vector<EvalSuite>{EvalSuite::kRuler});
  EXPECT_TRUE(all.evaluation.ruler_tasks.empty());  // all 11
  EXPECT_EQ(all.evaluation.ruler_samples, 20);
  EXPECT_EQ(all.evaluation.ruler_threshold, 85.6);
  const JobConfig some = LoadOk(
      "model: {path: /m}\ndata: {train: /t}\nevaluation:\n  suites: [passkey, ruler]\n"
      "  ruler: {tasks: [niah_single_1, niah_multikey_3, vt, cwe, fwe], samples: 5, threshold: 50}\n");
  EXPECT_EQ(some.evaluation.ruler_tasks, (std::vector<RulerTask>{RulerTask::kNiahSingle1, RulerTask::kNiahMultikey3,
                                                                 RulerTask::kVt, RulerTask::kCwe, RulerTask::kFwe}));
  EXPECT_EQ(some.evaluation.ruler_samples, 5);
  EXPECT_EQ(some.evaluation.ruler_threshold, 50);
  EXPECT_THAT(LoadError("model: {path: /m}\ndata: {train: /t}\nevaluation:\n  suites: [ruler]\n"),
              HasSubstr("evaluation.haystack: required by the ruler suite's essay tasks"));
  EXPECT_THAT(LoadError("model: {path: /m}\ndata: {train: /t}\nevaluation:\n  suites: [ruler]\n"
                        "  ruler: {tasks: [vt, niah_multivalue]}\n"),
              HasSubstr("evaluation.haystack: required by the ruler suite's essay tasks"));
  EXPECT_THAT(LoadError("model: {path: /m}\ndata: {train: /t}\nevaluation:\n  suites: [ruler]\n"
                        "  ruler: {tasks: [qa_1]}\n"),
              HasSubstr("evaluation.ruler.tasks"));
  EXPECT_THAT(LoadError("model: {path: /m}\ndata: {train: /t}\nevaluation:\n  suites: [ruler]\n"
                        "  ruler: {tasks: [vt, vt]}\n"),
              HasSubstr("evaluation.ruler.tasks: 'vt' is listed twice"));
  EXPECT_THAT(LoadError("model: {path: /m}\ndata: {train: /t}\nevaluation:\n  suites: [ruler]\n"
                        "  ruler: {tasks: [vt], threshold: 101}\n"),
              HasSubstr("evaluation.ruler.threshold"));
}

// A command's --rope-scaling is read and checked as model.rope_scaling is.
TEST(JobSpecTest, RopeScalingFlagReadsLikeTheSpec) {
  auto yarn = ParseRopeScaling("{type: yarn, factor: 8, original_max_position_embeddings: 8192}", "--rope-scaling");
  ASSERT_TRUE(yarn.ok()) << yarn.status();
  EXPECT_EQ(yarn->type, RopeType::kYarn);
  EXPECT_EQ(yarn->factor, 8.0);
  EXPECT_EQ(yarn->original_max_position_embeddings, 8192);
  EXPECT_THAT(std::string(ParseRopeScaling("{type: ntk, factor: 2}", "--rope-scaling").status().message()),
              HasSubstr("--rope-scaling:1: type: must be one of linear, dynamic, yarn, llama3"));
  EXPECT_THAT(std::string(ParseRopeScaling("{type: yarn}", "--rope-scaling").status().message()),
              HasSubstr("factor: is required"));
  EXPECT_THAT(std::string(ParseRopeScaling("{type: yarn, factor: -1}", "--rope-scaling").status().message()),
              HasSubstr("factor"));
}

// method.lora.init_adapter: a path (made absolute like every job path), only for LoRA.
TEST(JobSpecTest, InitAdapterIsAPathForLoraOnly) {
  const JobConfig j = LoadOk("model: {path: /m}\ndata: {train: /t}\nmethod: {lora: {init_adapter: /runs/a/final}}\n");
  EXPECT_EQ(j.method.lora.init_adapter, "/runs/a/final");
  EXPECT_TRUE(LoadOk(kMinimal).method.lora.init_adapter.empty());
  EXPECT_THAT(LoadError("model: {path: /m}\ndata: {train: /t}\nmethod:\n  type: full\n  lora: {init_adapter: /a}\n"),
              HasSubstr("job.yaml:5: method.lora.init_adapter: starts LoRA adapters: not with method.type full"));
}

// method.type evaluate: no training data (data.train refused), something to evaluate (suites,
// data.validation or both), one device; its adapter is method.lora.init_adapter, optional.
TEST(JobSpecTest, EvaluateReadsNoTrainingDataAndNeedsSomethingToEvaluate) {
  const JobConfig j = LoadOk(
      "model: {path: /m}\nmethod: {type: evaluate, lora: {init_adapter: /runs/a/final}}\n"
      "evaluation: {suites: [passkey], lengths: [4096]}\n");
  EXPECT_EQ(j.method.type, TrainMethod::kEvaluate);
  EXPECT_TRUE(j.data.train.empty());
  EXPECT_EQ(j.method.lora.init_adapter, "/runs/a/final");
  EXPECT_EQ(LoadOk("model: {path: /m}\nmethod: {type: evaluate}\ndata: {validation: /v}\n").method.type,
            TrainMethod::kEvaluate);
  EXPECT_THAT(LoadError("model: {path: /m}\nmethod: {type: evaluate}\ndata: {train: /t, validation: /v}\n"),
              HasSubstr("job.yaml:3: data.train: method.type evaluate trains nothing"));
  EXPECT_THAT(LoadError("model: {path: /m}\nmethod: {type: evaluate}\n"),
              HasSubstr("evaluation.suites: method.type evaluate needs something to evaluate"));
  EXPECT_THAT(LoadError("model: {path: /m}\nmethod: {type: evaluate}\ndata: {validation: /v}\n"
                        "training: {batch_sequences: 2}\nresources: {gpus: 2}\n"),
              HasSubstr("job.yaml:5: resources.gpus: method.type evaluate runs on one device, got 2"));
}

// What a method ignores is said (issue 52): an evaluate job's rank, training and checkpoint
// settings, eval_every_steps without a validation set; a suite listed twice is an error.
TEST(JobSpecTest, IgnoredSettingsWarnAndDuplicateSuitesAreRefused) {
  const auto warnings = [](const std::string& yaml) {
    v1::JobSpec spec;
    EXPECT_TRUE(spec::ParseYaml(yaml, {"job.yaml", ""}, &spec).ok()) << yaml;
    return IgnoredSettingWarnings(spec);
  };
  const std::vector<std::string> evaluate = warnings(
      "model: {path: /m}\nmethod: {type: evaluate, lora: {rank: 8}}\ndata: {validation: /v}\n"
      "checkpoint: {every_steps: 5}\n");
  ASSERT_EQ(evaluate.size(), 2u);
  EXPECT_THAT(evaluate[0], HasSubstr("method.lora.rank: ignored by method.type evaluate"));
  EXPECT_THAT(evaluate[1], HasSubstr("checkpoint: ignored by method.type evaluate"));
  EXPECT_TRUE(warnings("model: {path: /m}\nmethod: {type: evaluate}\ndata: {validation: /v}\n").empty());
  const std::vector<std::string> no_validation =
      warnings("model: {path: /m}\ndata: {train: /t}\ntraining: {eval_every_steps: 10}\n");
  ASSERT_EQ(no_validation.size(), 1u);
  EXPECT_THAT(no_validation[0], HasSubstr("training.eval_every_steps: no data.validation to evaluate"));
  EXPECT_TRUE(
      warnings("model: {path: /m}\ndata: {train: /t, validation: /v}\ntraining: {eval_every_steps: 10}\n").empty());
  EXPECT_THAT(LoadError("model: {path: /m}\nmethod: {type: evaluate}\nevaluation: {suites: [passkey, passkey]}\n"),
              HasSubstr("evaluation.suites: 'passkey' is listed twice"));
}

TEST(JobSpecTest, MissingRequiredFields) {
  EXPECT_THAT(LoadError("data: {train: /t}\n"), HasSubstr("job.yaml: model.path: is required"));
  EXPECT_THAT(LoadError("model: {path: /m}\n"), HasSubstr("job.yaml: data.train: is required"));
  EXPECT_THAT(LoadError(""), HasSubstr("model.path: is required"));
}

TEST(JobSpecTest, SyntaxErrorAndDuplicateKeyNameTheLine) {
  EXPECT_THAT(LoadError("model:\n  path: /m\n  dtype: [unclosed\n"), HasSubstr("job.yaml:"));
  EXPECT_THAT(LoadError("model:\n  path: /m\n  path: /n\ndata: {train: /t}\n"),
              HasSubstr("job.yaml:3: model.path: duplicate key"));
}

TEST(JobSpecTest, AProtoFromTheApiIsCheckedWithoutLines) {
  v1::JobSpec p;
  p.mutable_model()->set_path("/m");
  p.mutable_data()->set_train("/t");
  absl::StatusOr<JobConfig> c = ResolveJobSpec(&p);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->training.max_steps, 100);
  EXPECT_EQ(p.training().max_steps(), 100);  // the effective spec is what is stored
  EXPECT_EQ(p.model().dtype(), v1::ModelSpec::bfloat16);
  p.mutable_training()->set_learning_rate(-1);
  EXPECT_EQ(ResolveJobSpec(p).status().message(), "training.learning_rate: must be in (0, 10], got -1");
  EXPECT_EQ(ReasonOf(ResolveJobSpec(p).status()), Reason::kBadSpec);
  p.mutable_training()->set_learning_rate(std::numeric_limits<double>::quiet_NaN());
  EXPECT_THAT(ResolveJobSpec(p).status().message(), HasSubstr("training.learning_rate: must be a finite number"));
  p.mutable_training()->set_learning_rate(1e-3);
  p.mutable_memory()->set_kv_grad_dtype(static_cast<v1::KvGradDtype::Value>(99));
  EXPECT_THAT(ResolveJobSpec(p).status().message(),
              HasSubstr("memory.kv_grad_dtype: must be one of float32, bfloat16, auto; got the number 99"));
}

}  // namespace
}  // namespace oomb::server
