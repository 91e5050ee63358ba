// Rotary position embeddings as transformers' modeling_rope_utils computes them: the tables of
// the rope types default, linear, dynamic, yarn, llama3 and longrope from float32 inverse
// frequencies (float64 for float64 models), applied over the first rotary_dim features of a
// head.
//
// Thread-safety: functions of their arguments.
#ifndef OOMB_WORKER_MODEL_ROPE_H_
#define OOMB_WORKER_MODEL_ROPE_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>

#include "worker/hf/model_config.h"

namespace oomb {

// The inverse frequencies of `r` [rotary_dim / 2] in `master` (float32, or float64);
// rope_seq_len: dynamic NTK's sequence length.
at::Tensor RopeInvFreq(const ModelConfig& config, const RopeConfig& r, int64_t rope_seq_len, at::ScalarType master);
// cos and sin tables of `r` for the positions, [C, rotary_dim] each, in `dtype`.
std::pair<at::Tensor, at::Tensor> RopeTables(const ModelConfig& config, const RopeConfig& r,
                                             const at::Tensor& positions, int64_t rope_seq_len, at::ScalarType dtype);
// RoPE over the first rotary_dim features of each head of x [C, heads, head_dim].
at::Tensor RotateHeads(const ModelConfig& config, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace oomb

#endif  // OOMB_WORKER_MODEL_ROPE_H_
