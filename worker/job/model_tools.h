// Model commands for people and black-box checks (`oombd model inspect`, `oombd model eval`).
// Torch-free header.
#ifndef OOMB_WORKER_JOB_MODEL_TOOLS_H_
#define OOMB_WORKER_JOB_MODEL_TOOLS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/metrics/eval_report.h"

namespace oomb {

// Architecture, parameter count, dtypes, context window and tokenizer facts of a Hugging Face
// model directory, as a JSON object (text). Errors as Transformer::Load and Tokenizer report
// them (naming the file and the key or tensor).
absl::StatusOr<std::string> InspectModel(const std::string& model_dir);

struct EvalOptions {
  std::string model_dir;
  // Any of: "loss" (mean loss over the data), "positions" (the data's loss by position
  // bucket), "passkey" and "needle" (retrieval at lengths x depths, trials each; eval_suites.h).
  std::vector<std::string> suites = {"loss"};
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
};

struct EvalResult {
  double mean_loss = 0;  // mean next-token cross-entropy over the label tokens
  int64_t tokens = 0;    // label tokens scored
  int64_t samples = 0;
  EvalReport suites;  // positions, passkey, needle: those asked for
};

// Scores every sample separately (no packing) with the chunked forward (so a long evaluation
// fits wherever a training step of its length does), then the retrieval suites' documents.
// INVALID_ARGUMENT naming the flag for an unknown suite or a missing input.
absl::StatusOr<EvalResult> EvaluateModel(const EvalOptions& options);

struct GenerateResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> new_ids;  // greedy continuation (argmax at every step)
  std::string text;              // the decoded continuation
};

// Greedy decoding of `max_new_tokens` tokens after `prompt` (float32 on the CPU unless a GPU is
// present), stopping early at the tokenizer's end-of-sequence token. A full forward per token:
// meant for checking the model against transformers, not for serving.
absl::StatusOr<GenerateResult> GreedyGenerate(const std::string& model_dir, const std::string& prompt,
                                              int64_t max_new_tokens);

}  // namespace oomb

#endif  // OOMB_WORKER_JOB_MODEL_TOOLS_H_
