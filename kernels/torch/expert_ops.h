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

// One expert bank's operands as GroupedMatmul takes them (kernels/torch/matmul.h: each expert's
// matrix column-major): weight W_e^T [E, in, out] and, with LoRA, a = A_e^T [E, in, r] and
// b = (B_e alpha / r)^T [E, r, out] (both undefined without an adapter).
struct GroupedBankOperands {
  at::Tensor weight, a, b;
};

// A mixture of experts' MLP over its tokens y [C, hidden] on grouped products, without biases
// and with the experts' weights frozen (LoRA): each token's sum over its top_k pairs of
//   d(act(g(x)) * scale),   g(x) = x Wg + (x Ag) Bg,   d(h) = h Wd + (h Ad) Bd,
// x the pair's token's row, scale [C k] each sorted pair's routing weight, offs [E] int32 the
// experts' groups' ends in the sorted pairs, act as in ScaledExpertActivation (alpha, limit):
// the values of FromPairs over the separate functions and GroupedMatmul, in one autograd function
// that keeps of the pairs only the activation's input ([C k, 2 n]) and the LoRA intermediates
// ([C k, r]), where the separate functions also keep every pair's input row (LoRA A's input) and
// activation (down's LoRA A's input): backward gathers the rows from y again and recomputes the
// activation, and sums the pairs' two input gradients (through Wg and through Ag) into their
// tokens in one pass (PairSum's two sources) rather than adding them pair-wide first. With
// recompute_gate_up it keeps not even the activation's input: backward recomputes gate_up's
// product (one grouped product more) from the rows it gathers anyway. Differentiable in y, scale
// and the LoRA factors.
at::Tensor GroupedExpertMlp(const at::Tensor& y, const at::Tensor& order, const at::Tensor& inverse, int64_t top_k,
                            const at::Tensor& offs, const at::Tensor& scale, const GroupedBankOperands& gate_up,
                            const GroupedBankOperands& down, double alpha, double limit,
                            bool recompute_gate_up = false);

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_TORCH_EXPERT_OPS_H_
