// The job spec: one fine-tuning job, field for field the YAML document of JOBSPEC.md
// (shared/design/JOBSPEC.md) and the gRPC message oomb.v1.JobSpec. Torch-free (see
// worker/CMakeLists.txt on include hygiene): the daemon, the CLI tools and the executor all use
// it.
//
// Every field carries its documented default here, next to its declaration; a default-
// constructed JobSpec is the document with every key left out (it is not valid until
// `model.path` and `data.train` are set). Enumerations are strings checked against the allowed
// values listed in the comment.
//
// Errors: every function here returns INVALID_ARGUMENT for a bad document, with a message that
// names the source, the line (when there is one) and the dotted field path, e.g.
//
//   job.yaml:14: training.learning_rate: must be > 0, got -1
//   job.yaml:3: model.dtpye: unknown key (known keys under model: path, dtype, rope_scaling)
//
// Thread-safety: plain values and pure functions; no shared state.
#ifndef OOMB_WORKER_JOB_JOB_SPEC_H_
#define OOMB_WORKER_JOB_JOB_SPEC_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace oomb {

// RoPE scaling that overrides config.json's, to train past the pretrained window.
struct RopeScalingSpec {
  std::string type;                              // required: linear | dynamic | yarn | llama3
  double factor = 1.0;                           // > 0
  int64_t original_max_position_embeddings = 0;  // >= 0; 0: the model's max_position_embeddings
  double low_freq_factor = 0;                    // >= 0; llama3; 0: the method's default (1)
  double high_freq_factor = 0;                   // >= 0; llama3; 0: the method's default (4)
  double beta_fast = 0;                          // >= 0; yarn; 0: the method's default (32)
  double beta_slow = 0;                          // >= 0; yarn; 0: the method's default (1)

  friend bool operator==(const RopeScalingSpec&, const RopeScalingSpec&) = default;
};

struct ModelSpec {
  std::string path;                             // required: Hugging Face directory (config.json, ...)
  std::string dtype = "bfloat16";               // bfloat16 | float32 (weights and compute)
  std::optional<RopeScalingSpec> rope_scaling;  // default null: config.json's own scaling

  friend bool operator==(const ModelSpec&, const ModelSpec&) = default;
};

struct LoraSpec {
  int32_t rank = 16;     // > 0
  double alpha = 32;     // > 0; the update is scaled by alpha / rank
  double dropout = 0.0;  // in [0, 1)
  // Non-empty; module names matched against the last component of each linear layer's name.
  std::vector<std::string> target_modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};

  friend bool operator==(const LoraSpec&, const LoraSpec&) = default;
};

struct MethodSpec {
  std::string type = "lora";  // lora | full
  LoraSpec lora;              // used when type == lora

  friend bool operator==(const MethodSpec&, const MethodSpec&) = default;
};

struct DataSpec {
  std::string train;             // required: JSONL ({"text"} | {"messages"} | {"prompt","completion"} | {"input_ids"})
  std::string validation;        // default null (empty): no validation set
  int64_t max_seq_len = 131072;  // tokens per training sequence; in [1, 2^31]
  bool packing = true;           // pack documents up to max_seq_len, no attention across them
  std::string too_long = "truncate";  // truncate | drop | error
  int64_t shuffle_seed = 0;           // any integer

  friend bool operator==(const DataSpec&, const DataSpec&) = default;
};

struct AdamSpec {
  double beta1 = 0.9;    // in [0, 1)
  double beta2 = 0.999;  // in [0, 1)
  double eps = 1e-8;     // > 0

  friend bool operator==(const AdamSpec&, const AdamSpec&) = default;
};

struct TrainingSpec {
  // Exactly one of max_steps and epochs is in force: setting `epochs` in a document clears the
  // default max_steps (to 0); a document that sets both is rejected.
  int64_t max_steps = 100;             // optimizer steps, > 0 unless epochs > 0
  int64_t epochs = 0;                  // >= 0; > 0: train this many passes over the data instead
  int64_t batch_sequences = 1;         // > 0: sequences per optimizer step (gradient accumulation)
  double learning_rate = 2.0e-4;       // > 0
  std::string lr_schedule = "cosine";  // constant | linear | cosine
  int64_t warmup_steps = 10;           // >= 0
  double weight_decay = 0.0;           // >= 0
  AdamSpec adam;
  double max_grad_norm = 1.0;    // >= 0; 0 disables clipping
  int64_t seed = 42;             // any integer
  int64_t eval_every_steps = 0;  // >= 0; 0: no periodic eval

  friend bool operator==(const TrainingSpec&, const TrainingSpec&) = default;
};

struct MemorySpec {
  int64_t chunk_tokens = 4096;            // > 0: tokens per chunk (chunk-recurrent training)
  int64_t page_tokens = 128;              // > 0: tokens per KV page (need not divide chunk_tokens)
  std::string kv_offload = "auto";        // auto | none | host
  std::string kv_grad_dtype = "float32";  // float32 | bfloat16 (storage of dK/dV pages)

  friend bool operator==(const MemorySpec&, const MemorySpec&) = default;
};

struct SparseAttentionSpec {
  int64_t page_budget = 64;            // > 0: past pages attended per query tile
  int64_t sink_pages = 1;              // >= 0; sink_pages + local_pages <= page_budget
  int64_t local_pages = 4;             // >= 0
  std::string selection = "mean_key";  // mean_key | min_max

  friend bool operator==(const SparseAttentionSpec&, const SparseAttentionSpec&) = default;
};

struct AttentionSpec {
  std::string mode = "dense";  // dense | sparse
  SparseAttentionSpec sparse;  // used when mode == sparse

  friend bool operator==(const AttentionSpec&, const AttentionSpec&) = default;
};

struct BackwardSpec {
  double chunk_fraction = 1.0;  // in (0, 1]; < 1: SpaCO sparse chunk-wise backward (unbiased)

  friend bool operator==(const BackwardSpec&, const BackwardSpec&) = default;
};

struct CheckpointSpec {
  int64_t every_steps = 50;  // >= 0; 0: only at the end
  int64_t keep_last = 3;     // > 0
  std::string dir;           // default null (empty): under the daemon's data dir

  friend bool operator==(const CheckpointSpec&, const CheckpointSpec&) = default;
};

struct ResourcesSpec {
  std::string device = "auto";      // auto | cpu | cuda | cuda:N
  int32_t gpus = 1;                 // > 0
  int32_t priority = 0;             // any; higher runs first
  int32_t max_retries = 2;          // >= 0
  int64_t max_runtime_seconds = 0;  // >= 0; 0: no limit

  friend bool operator==(const ResourcesSpec&, const ResourcesSpec&) = default;
};

struct JobSpec {
  std::string display_name;                   // default empty
  std::map<std::string, std::string> labels;  // default empty
  ModelSpec model;
  MethodSpec method;
  DataSpec data;
  TrainingSpec training;
  MemorySpec memory;
  AttentionSpec attention;
  BackwardSpec backward;
  CheckpointSpec checkpoint;
  ResourcesSpec resources;

  friend bool operator==(const JobSpec&, const JobSpec&) = default;
};

// Parses one YAML document into a JobSpec with defaults for every absent key, then validates it
// (ValidateJobSpec). `source_name` prefixes messages ("job.yaml:14: ..."); when empty, messages
// start with the field path. INVALID_ARGUMENT for YAML syntax errors, unknown keys, wrong types
// (e.g. a string where an integer belongs, a fraction for an integer), out-of-range values,
// and missing required fields (model.path, data.train).
absl::StatusOr<JobSpec> ParseJobSpecYaml(const std::string& yaml, const std::string& source_name);

// Applies one `--set` override, "dotted.path=value", e.g. "training.max_steps=5",
// "method.lora.target_modules=[q_proj, v_proj]", "labels.team=nlp", "model.rope_scaling=null".
// The value is read as YAML, with the same type and range checks as ParseJobSpecYaml, plus the
// cross-field checks (not the required-field checks: call ValidateJobSpec when done). Setting
// training.epochs > 0 clears max_steps and vice versa. On error `spec` is unchanged and the
// message starts with "--set <key_eq_value>: ".
absl::Status ApplyOverride(JobSpec* spec, const std::string& key_eq_value);

// Every check of ParseJobSpecYaml that needs no source text: ranges, allowed values, required
// fields, cross-field constraints. Messages start with the dotted field path. Used for specs
// that arrive as protobuf messages.
absl::Status ValidateJobSpec(const JobSpec& spec);

// The spec as a complete YAML document (every field, defaults included, in JOBSPEC.md's
// order). ParseJobSpecYaml(JobSpecToYaml(s)) reproduces `s` exactly.
std::string JobSpecToYaml(const JobSpec& spec);

}  // namespace oomb

#endif  // OOMB_WORKER_JOB_JOB_SPEC_H_
