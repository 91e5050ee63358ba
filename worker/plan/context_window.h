// A job's context against its model's window: the RoPE scaling it asks for checked against the
// model's config.json, and warnings for a context the model was not trained to reach. Used at
// submit (CreateJob) and by `oombd run`, before any training. Torch-free.
#ifndef OOMB_WORKER_PLAN_CONTEXT_WINDOW_H_
#define OOMB_WORKER_PLAN_CONTEXT_WINDOW_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/hf/model_config.h"
#include "worker/plan/job_config.h"

namespace oomb {

// The window `config`'s RoPE reaches: max_position_embeddings, or factor x the original window
// for linear, yarn and llama3 scaling (dynamic scaling extrapolates from max_position_embeddings
// at any length); 0 when config.json gives none.
int64_t ContextWindow(const ModelConfig& config);

// INVALID_ARGUMENT naming model.rope_scaling's field when the scaling `job` asks for cannot
// apply to `base` (the model's config.json as read): yarn and llama3 need the original window,
// which neither the spec nor config.json gives; a model with longrope (Phi-3) keeps its own.
absl::Status CheckRopeScaling(const ModelConfig& base, const JobConfig& job);

// Messages for people, one per finding: documents longer than the model's window with no RoPE
// scaling (positions restart at each document, so a document's length is the furthest position
// the model sees); longer than the extended window with scaling; a model.rope_scaling that
// replaces config.json's own scaling. `longest_sample`: the longest sample's tokens when the
// datasets were read (capped at data.max_seq_len); 0: unknown, data.max_seq_len stands for it.
std::vector<std::string> ContextWindowWarnings(const ModelConfig& base, const JobConfig& job,
                                               int64_t longest_sample = 0);

}  // namespace oomb

#endif  // OOMB_WORKER_PLAN_CONTEXT_WINDOW_H_
