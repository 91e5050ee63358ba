// A mixture of experts' layer around its expert products, as LibTorch autograd functions that
// keep less for backward, and scatter less in it, than the separate ATen ops
// (tests/kernels/layer_ops_test.cc checks values and gradients against those ops).
//
// The (token, slot) pairs of C tokens routed to top_k experts each are numbered t k + j; `order`
// [C k] (int64) lists them sorted by expert and `inverse` is its inverse permutation (pair
// t k + j is row inverse[t k + j] of the sorted rows).
#ifndef OOMB_KERNELS_TORCH_EXPERT_OPS_H_
#define OOMB_KERNELS_TORCH_EXPERT_OPS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace oomb::kernels {

// The pairs' rows in expert order: row p is x[order[p] / top_k]; x [C, hidden] -> [C k, hidden].
// Its gradient is FromPairs of the output's: a gather and a sum of each token's top_k rows,
// where index_select's backward adds the rows into place one at a time (index_add_, atomic, and
// in bfloat16 rounded after each addition).
at::Tensor ToPairs(const at::Tensor& x, const at::Tensor& order, const at::Tensor& inverse, int64_t top_k);

// Each token's sum over its top_k pairs' rows: rows [C k, hidden] in expert order -> [C, hidden]
// (summed in float32 for bfloat16 / float16 rows, rounded once; layer_ops.h PairSum: on a GPU
// one kernel that gathers and sums). `extra`, where defined, is added to rows in the same sum
// (rows' shape and dtype: the experts' LoRA update, not first added to their product in a
// pair-wide tensor of its own). Its gradient, for rows and extra alike, is ToPairs of the
// output's; nothing is kept for backward but the permutations.
at::Tensor FromPairs(const at::Tensor& rows, const at::Tensor& order, const at::Tensor& inverse, int64_t top_k,
                     const at::Tensor& extra = at::Tensor());

// The experts' activation over their gate_up product [rows, 2 n] (plus `add`, where defined:
// gate_up's shape and dtype, the bank's LoRA update, added first as in a separate addition but
// not written to a pair-wide tensor of its own on the kernels), each row scaled by its pair's
// routing weight scale [rows]: act(gate_up + add) * scale, cast to gate_up's dtype (the product
// taken in scale's dtype when wider), [rows, n]. act is SwiGLU over the halves (SwiGluHalves)
// or, where limit > 0, gpt-oss's clamped SwiGLU (ClampedSwiGlu with alpha and limit). Keeps only
// the activation's input and scale for backward, and only where a backward may follow, and
// recomputes act there (the separate ops also keep act); with SwiGLU on a GPU one kernel forward
// and one backward (layer_ops.h ScaledSwiGluHalves). Differentiable in gate_up, add and scale.
at::Tensor ScaledExpertActivation(const at::Tensor& gate_up, const at::Tensor& scale, double alpha, double limit,
                                  const at::Tensor& add = at::Tensor());

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_TORCH_EXPERT_OPS_H_
