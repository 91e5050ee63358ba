// A job as the engine consumes it: the job spec (proto/oomb/v1/job_spec.proto, the one schema)
// resolved once, with every default applied, every value checked and every word an enum
// (server/job_spec.h, ResolveJobSpec). The engine (executor, planner, data validation, the
// benchmark) reads this and nothing else of the spec; its fields mean what the spec's fields of
// the same names document, so they are not restated here.
//
// Torch-free (see worker/CMakeLists.txt). Plain values; thread-safe as values are.
#ifndef OOMB_WORKER_PLAN_JOB_CONFIG_H_
#define OOMB_WORKER_PLAN_JOB_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "worker/data/dataset.h"
#include "worker/hf/model_config.h"
#include "worker/metrics/eval_report.h"

namespace oomb {

enum class ModelDtype { kBFloat16, kFloat32 };
// kEvaluate: no training; the evaluation section (and data.validation's loss) once, on the base
// model with method.lora.init_adapter when set.
enum class TrainMethod { kLora, kFull, kEvaluate };
enum class LrSchedule { kConstant, kLinear, kCosine };
enum class KvOffload { kAuto, kNone, kHost };
// kAuto: PlanMemory chooses (MemoryPlan::kv_grad_dtype), the training session uses its choice.
enum class KvGradDtype { kFloat32, kBFloat16, kAuto };
inline const char* KvGradDtypeName(KvGradDtype d) {
  return d == KvGradDtype::kBFloat16 ? "bfloat16" : d == KvGradDtype::kFloat32 ? "float32" : "auto";
}
enum class PageSummaryKind { kMeanKey, kMinMax };

struct JobConfig {
  std::string display_name;
  std::map<std::string, std::string> labels;

  struct Model {
    std::string path;
    ModelDtype dtype = ModelDtype::kBFloat16;
    std::optional<RopeScalingOverride> rope_scaling;
    std::optional<double> router_aux_loss_coef;  // over config.json's (MoeConfig::aux_loss_coef)
  } model;

  struct Lora {
    int32_t rank = 16;
    double alpha = 32;
    double dropout = 0;
    std::vector<std::string> target_modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                               "gate_proj", "up_proj", "down_proj"};
    std::string init_adapter;                    // a PEFT adapter directory to start from; empty: PEFT's initialisation
    std::vector<std::string> target_parameters;  // expert banks (PEFT's target_parameters)
  };
  struct Method {
    TrainMethod type = TrainMethod::kLora;
    Lora lora;
  } method;

  struct Data {
    std::string train, validation;  // validation: empty when none
    int64_t max_seq_len = 131072;
    bool packing = true;
    TooLong too_long = TooLong::kTruncate;
    int64_t shuffle_seed = 0;
    int64_t validation_max_tokens = 0;  // 0: every validation token
  } data;

  struct Training {
    int64_t max_steps = 100;  // 0 when `epochs` decides
    int64_t epochs = 0;
    int64_t batch_sequences = 1;
    double learning_rate = 2e-4;
    LrSchedule lr_schedule = LrSchedule::kCosine;
    int64_t warmup_steps = 10;
    double weight_decay = 0;
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
    double max_grad_norm = 1.0;
    int64_t seed = 42;
    int64_t eval_every_steps = 0;
  } training;

  struct Memory {
    // 0: auto (the spec's default; PlanMemory chooses, and the training session trains with its
    // choice). This struct's 4096 serves code that builds a JobConfig by hand.
    int64_t chunk_tokens = 4096;
    // The spec's auto is resolved when the spec is read (ResolveJobSpec): 256 with sparse
    // attention, 128 otherwise.
    int64_t page_tokens = 128;
    KvOffload kv_offload = KvOffload::kAuto;
    // The spec's default is auto; this struct's float32 serves code that builds a JobConfig by
    // hand.
    KvGradDtype kv_grad_dtype = KvGradDtype::kFloat32;
    // Stage 1 keeps the latest chunks' attention results on the host for stage 2 (dense exact
    // training; worker/train/attention_swap.h), within what the planner leaves of the host.
    bool swap_attention = true;
    // Not a spec field: what memory.chunk_tokens auto chooses with its chunk (PlanMemory's
    // MemoryPlan::expert_recompute_layers, which the training session applies).
    int64_t expert_recompute_layers = 0;
  } memory;

  // Sparse attention when set (attention.mode: sparse), dense otherwise.
  struct Sparse {
    int64_t page_budget = 64;
    int64_t sink_pages = 1;
    int64_t local_pages = 4;
    PageSummaryKind selection = PageSummaryKind::kMeanKey;
  };
  std::optional<Sparse> sparse;

  double chunk_fraction = 1.0;  // backward.chunk_fraction

  // What was chosen for fields the spec left auto when it was read, in words, with why
  // (ResolveJobSpec; PlanMemory's MemoryPlan::choices lists these first).
  std::vector<std::string> choices;

  struct Checkpoint {
    int64_t every_steps = 50;
    int64_t keep_last = 3;
    std::string dir;  // empty: the daemon's default
  } checkpoint;

  struct Resources {
    std::string device = "auto";
    int32_t gpus = 1;
    int32_t priority = 0;
    int32_t max_retries = 2;
    int64_t max_runtime_seconds = 0;
  } resources;

  // proto ParallelSpec: resources.gpus ranks in groups of `tensor` (tensor parallelism,
  // worker/model/tensor_parallel.h), the groups data-parallel.
  struct Parallel {
    int32_t tensor = 1;
  } parallel;

  // Long-context evaluation while training (proto EvaluationSpec); no suites: none.
  struct Evaluation {
    std::vector<EvalSuite> suites;  // each once, in the order given
    int64_t every_steps = 0;        // 0: after the last step only
    std::vector<int64_t> lengths;   // resolved: data.max_seq_len when the spec gives none
    int64_t depths = 5;
    int64_t trials = 1;
    uint64_t seed = 1;
    std::string haystack;
    // ruler: RULER's tasks (empty: all 11), documents per task and length, and the effective
    // length's threshold (0 .. 100).
    std::vector<RulerTask> ruler_tasks;
    int64_t ruler_samples = 20;
    double ruler_threshold = kRulerThreshold;
  } evaluation;
};

}  // namespace oomb

#endif  // OOMB_WORKER_PLAN_JOB_CONFIG_H_
