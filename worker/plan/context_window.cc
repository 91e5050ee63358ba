#include "worker/plan/context_window.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace oomb {

int64_t ContextWindow(const ModelConfig& config) {
  const RopeConfig& r = config.rope;
  if (r.type == RopeType::kDefault || r.type == RopeType::kDynamic) return config.max_position_embeddings;
  const int64_t original =
      r.original_max_position_embeddings > 0 ? r.original_max_position_embeddings : config.max_position_embeddings;
  return std::max(config.max_position_embeddings, static_cast<int64_t>(std::llround(r.factor * original)));
}

absl::Status CheckRopeScaling(const ModelConfig& base, const JobConfig& job) {
  if (!job.model.rope_scaling.has_value()) return absl::OkStatus();
  const RopeScalingOverride& s = *job.model.rope_scaling;
  if (base.rope.type == RopeType::kLongrope) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.rope_scaling: ", job.model.path, "/config.json scales its RoPE with longrope (to ",
                     base.max_position_embeddings, " tokens, trained so); a job's RoPE scaling cannot replace it"));
  }
  const bool needs_original = s.type == RopeType::kYarn || s.type == RopeType::kLlama3;
  const ModelConfig scaled = ApplyRopeScaling(base, s);
  if (needs_original && scaled.rope.original_max_position_embeddings <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.rope_scaling.original_max_position_embeddings: required for ",
                                                   RopeTypeName(s.type), " scaling: ", job.model.path,
                                                   "/config.json gives no max_position_embeddings to extend"));
  }
  return absl::OkStatus();
}

std::vector<std::string> ContextWindowWarnings(const ModelConfig& base, const JobConfig& job, int64_t longest_sample) {
  std::vector<std::string> out;
  const int64_t max_seq_len = job.data.max_seq_len;
  const int64_t length = longest_sample > 0 ? std::min(longest_sample, max_seq_len) : max_seq_len;
  const std::string what = longest_sample > 0 ? absl::StrCat("the longest sample (", length, " tokens)")
                                              : absl::StrCat("data.max_seq_len (", length, ")");
  const ModelConfig trained =
      job.model.rope_scaling.has_value() ? ApplyRopeScaling(base, *job.model.rope_scaling) : base;
  const int64_t window = ContextWindow(trained);
  if (job.model.rope_scaling.has_value() && base.rope.type != RopeType::kDefault) {
    out.push_back(absl::StrCat("model.rope_scaling replaces the ", RopeTypeName(base.rope.type), " scaling of ",
                               job.model.path, "/config.json (factor ", base.rope.factor, ")"));
  }
  if (window <= 0 || length <= window) return out;
  if (trained.rope.type == RopeType::kDefault) {
    out.push_back(absl::StrCat(what, " exceeds the model's window (max_position_embeddings ", window,
                               ") and no RoPE scaling is set: positions past ", window,
                               " are ones the model never saw; set model.rope_scaling (for example {type: yarn, "
                               "factor: ",
                               static_cast<int64_t>(std::ceil(static_cast<double>(length) / window)), "})"));
  } else if (trained.rope.type != RopeType::kDynamic) {
    out.push_back(absl::StrCat(what, " exceeds the window of the ", RopeTypeName(trained.rope.type),
                               " RoPE scaling (factor ", trained.rope.factor, " x ",
                               trained.rope.original_max_position_embeddings, " = ", window,
                               " tokens); raise model.rope_scaling.factor"));
  }
  return out;
}

}  // namespace oomb
