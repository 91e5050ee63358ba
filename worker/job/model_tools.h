// Model commands for people and black-box checks (`oombd model inspect`, `oombd model eval`,
// `oombd model generate`).
// Torch-free header.
#ifndef OOMB_WORKER_JOB_MODEL_TOOLS_H_
#define OOMB_WORKER_JOB_MODEL_TOOLS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/hf/model_config.h"
#include "worker/metrics/eval_report.h"

namespace oomb {

// Architecture, parameter count, dtypes, context window and tokenizer facts of a Hugging Face
// model directory, as a JSON object (text). Errors as Transformer::Load and Tokenizer report
// them (naming the file and the key or tensor).
absl::StatusOr<std::string> InspectModel(const std::string& model_dir);

struct EvalOptions {
  std::string model_dir;
  // The mean loss over the data, and the suites (eval_suites.h): positions (the data's loss by
  // position bucket), passkey and needle (retrieval at lengths x depths, trials each), ruler
  // (RULER's tasks at lengths).
  bool loss = true;
  std::vector<EvalSuite> suites;
  std::string data_path;    // JSONL in any dataset format (loss, positions)
  std::string adapter_dir;  // optional PEFT adapter (adapter_config.json + adapter_model.safetensors)
  int64_t max_tokens = 0;   // 0: every sample; else stop after this many tokens (the last sample cut)
  int64_t chunk_tokens = 4096;
  std::string dtype = "float32";  // float32 | bfloat16
  std::string device = "auto";
  // passkey and needle: tokens per document, depths (0 .. 1), documents per cell, the seed of
  // keys and offsets, and needle's haystack (a UTF-8 text file).
  std::vector<int64_t> lengths = {4096};
  int64_t depths = 5;
  int64_t trials = 1;
  uint64_t seed = 1;
  std::string haystack;
  // ruler (RULER's synthetic tasks, at `lengths` with `seed`; `haystack` for its essay tasks):
  // the tasks (empty: all 11), documents per task and length, the effective length's threshold.
  std::vector<RulerTask> ruler_tasks;
  int64_t ruler_samples = 20;
  double ruler_threshold = kRulerThreshold;
  // RoPE scaling over config.json's and the adapter's (e.g. the base model evaluated with the
  // scaling a fine-tune will use: the "before" figures).
  std::optional<RopeScalingOverride> rope_scaling = std::nullopt;
  // The run's warnings (worker/job/executor.h, RunOptions::on_warning); may be empty.
  std::function<void(const std::string&)> on_warning;
};

struct EvalResult {
  double mean_loss = 0;  // mean next-token cross-entropy over the label tokens
  int64_t tokens = 0;    // label tokens scored
  int64_t samples = 0;
  EvalReport suites;  // those asked for
};

// Runs the evaluate job (method.type evaluate) of these options through the job executor
// (worker/job/executor.h, RunJob): --data as data.validation, each sample its own sequence (no
// packing, no length limit) cut after max_tokens tokens in all (data.validation_max_tokens), the
// suites as the evaluation section, pages planned by the memory planner, its metrics.jsonl in a
// scratch directory removed afterwards. Errors are the job's, naming the command's flags instead
// of the spec's fields (--data for data.validation), with their reasons; INVALID_ARGUMENT naming
// the flag of a missing input.
absl::StatusOr<EvalResult> EvaluateModel(const EvalOptions& options);

struct GenerateOptions {
  std::string model_dir;
  std::string adapter_dir;  // optional PEFT adapter (its base_config.json's RoPE applies)
  std::string prompt;       // UTF-8; or
  std::string prompt_file;  // a UTF-8 file holding the prompt
  int64_t max_new_tokens = 16;
  int64_t prefill_chunk_tokens = 4096;  // the prompt's forward, this many tokens at a time
  std::string dtype = "float32";        // float32 | bfloat16
  std::string device = "auto";          // auto | cpu | cuda
  std::optional<RopeScalingOverride> rope_scaling = std::nullopt;
  // Called after each prefill chunk with (prompt tokens done, prompt tokens); may be empty.
  std::function<void(int64_t, int64_t)> on_prefill;
};

struct GenerateResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> new_ids;  // greedy continuation (argmax at every step)
  std::string text;              // the decoded continuation
};

// Greedy decoding of up to `max_new_tokens` tokens after the prompt, stopping early at the
// tokenizer's end-of-sequence token. The prompt is encoded as transformers' tokenizer(prompt)
// does: with the post-processor's special tokens (Gemma's and Llama-3's BOS). The prompt runs through the model in
// chunks of `prefill_chunk_tokens` over a key/value cache (the paged attention's past), then one token per forward, so
// memory grows with the cache (2 x layers x kv_dim values a token), never with the square of the prompt: prompts of
// 100K+ tokens work. INVALID_ARGUMENT naming the flag for an empty prompt or a bad option.
absl::StatusOr<GenerateResult> GreedyGenerate(const GenerateOptions& options);

}  // namespace oomb

#endif  // OOMB_WORKER_JOB_MODEL_TOOLS_H_
