// What the attention functions of this folder (paged_attention.cc, sparse_attention.cc) share:
// the checks of one chunk's q, k, v and document starts, and the type they compute in. Internal
// to kernels/torch.
#ifndef OOMB_KERNELS_TORCH_ATTENTION_INPUTS_H_
#define OOMB_KERNELS_TORCH_ATTENTION_INPUTS_H_

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <utility>

namespace oomb::kernels {

// float64 inputs are computed in float64; everything else (float32, bf16, fp16) in float32.
inline at::ScalarType AttentionComputeType(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// q [C, num_heads, D], k and v [C, kv_heads, D] of one dtype with num_heads a multiple of
// kv_heads, doc_start int64 [C] on q's device or the CPU; c10::Error naming the argument
// otherwise.
inline void CheckChunkAttentionInputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& doc_start) {
  TORCH_CHECK(q.dim() == 3, "q: expected [C, num_heads, head_dim], got ", q.sizes());
  TORCH_CHECK(k.dim() == 3 && k.size(0) == q.size(0) && k.size(2) == q.size(2),
              "k: expected [C, kv_heads, head_dim] matching q ", q.sizes(), ", got ", k.sizes());
  TORCH_CHECK(v.sizes() == k.sizes(), "v: expected the shape of k ", k.sizes(), ", got ", v.sizes());
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "num_heads (", q.size(1), ") must be a multiple of kv_heads (", k.size(1),
              ")");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), "q, k, v: dtypes differ");
  TORCH_CHECK(doc_start.dim() == 1 && doc_start.size(0) == q.size(0) && doc_start.scalar_type() == at::kLong,
              "doc_start: expected int64 [", q.size(0), "], got ", doc_start.scalar_type(), " ", doc_start.sizes());
  TORCH_CHECK(doc_start.is_cpu() || doc_start.device() == q.device(), "doc_start: expected on ", q.device(),
              " or the CPU, got ", doc_start.device());
}

// Attention sinks (gpt-oss): one more logit s_h in each softmax of query head h, whose value is
// zero. Folded into a finished attention's log-sum-exp and output, in the caller's layout:
//   lse' = logaddexp(lse, s),  out' = out exp(lse - lse').
// `s` is shaped to broadcast against `lse`; FoldSinks replaces lse by lse' and returns the
// factor exp(lse - lse') (lse's shape) the caller scales its output by. Backward run against
// out' and lse' as without sinks gives q, k and v their exact gradients: the probabilities it
// recomputes, exp(score - lse'), are the sink softmax's, and the sink's zero value adds nothing
// to dV nor to <dout, out'>. The sinks' own gradient is
//   ds_h = -sum_i exp(s_h - lse'_i) <dout_i, out'_i>
// over head h's queries: SinkGradTerms gives its terms in lse's layout from di = <dout, out'>.
inline at::Tensor FoldSinks(at::Tensor& lse, const at::Tensor& s) {
  at::Tensor folded = at::logaddexp(lse, s);
  at::Tensor factor = at::exp(lse - folded);
  lse = std::move(folded);
  return factor;
}
inline at::Tensor SinkGradTerms(const at::Tensor& lse, const at::Tensor& s, const at::Tensor& di) {
  return at::exp(s - lse).mul_(di).neg_();
}

// The sinks as the autograd functions take them: an undefined tensor (none) as an empty one
// (autograd takes no undefined input); and back.
inline at::Tensor SinksArgument(const at::Tensor& sinks) { return sinks.defined() ? sinks : at::empty({0}); }
inline at::Tensor SinksOrNone(const at::Tensor& argument) { return argument.numel() > 0 ? argument : at::Tensor(); }

// `sinks` (undefined, or [num_heads] of a floating type on q's device); c10::Error naming it
// otherwise.
inline void CheckSinks(const at::Tensor& sinks, const at::Tensor& q) {
  if (!sinks.defined()) return;
  TORCH_CHECK(sinks.dim() == 1 && sinks.size(0) == q.size(1) && sinks.device() == q.device() &&
                  at::isFloatingType(sinks.scalar_type()),
              "sinks: expected a float [", q.size(1), "] on ", q.device(), ", got ", sinks.scalar_type(), " ",
              sinks.sizes(), " on ", sinks.device());
}

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_TORCH_ATTENTION_INPUTS_H_
