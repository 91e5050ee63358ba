// A mixture of experts' MLP block (LayerSpec::moe): the router and the expert banks, computed as
// transformers' Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock (softmax over the router's logits
// in float32, float64 for float64 models, top-k, renormalised where the family does; each
// expert's SwiGLU over its tokens, weighted and summed; oomb weights the activation before the
// down projection, kernels/torch/expert_ops.h), and gpt-oss's (the router's and the experts'
// biases, its clamped SwiGLU). Experts run as one loop over the experts hit, or grouped GEMMs
// (ExpertKernel), their tokens gathered once per layer and chunk in expert order.
//
// Thread-safety: as the model is.
#ifndef OOMB_WORKER_MODEL_EXPERT_MLP_H_
#define OOMB_WORKER_MODEL_EXPERT_MLP_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "worker/hf/layer_spec.h"
#include "worker/model/block_context.h"
#include "worker/model/linear.h"

namespace oomb {

// One projection of every expert ([experts, out, in], ExpertBankSpec) with an optional LoRA
// adapter in PEFT's layout (PEFT's target_parameters: a ParamWrapper over
// mlp.experts.<bank>): one A of [E r, in] and one B of [out, r E] hold every expert's; expert
// e's update is B[:, k E + e] A[e r + k] summed over k, times alpha / r, applied per expert to
// its tokens, never as a weight. PEFT takes no dropout there. Split like a linear layer of its
// ExpertBankSpec (every expert alike).
struct ExpertBank {
  at::Tensor weight;  // [E, out, in]
  at::Tensor bias;    // [E, out] (MoeSpec::biases) or undefined
  at::Tensor lora_a;  // [E rank, in] or undefined
  at::Tensor lora_b;  // [out, rank E]
  double lora_scaling = 0;
  bool row_parallel = false;   // ExpertBankSpec::row_parallel (set with the layer)
  std::vector<int64_t> parts;  // ExpertBankSpec::parts

  void Describe(const ExpertBankSpec& spec);
  // The bank's tensors with their splits (the weight's along out, or in when row-parallel).
  void AddSlots(std::vector<TensorSlot>* out);
};

// The router's auxiliary load-balancing loss of one sequence (MoeConfig::aux_loss_coef > 0), as
// transformers' load_balancing_loss_func computes it over one forward:
//   aux = E * sum_e (n_e / N) * (S_e / N)
// over the N rows (token, sparse layer) of the sequence, n_e how many of the rows' top-k choices
// are expert e and S_e the sum of the rows' router probabilities of e (the routing's softmax, in
// float32; float64 for float64 models). The counts have no gradient, so once they are known aux
// is linear in the probabilities and its gradient is that of sum_rows <P_row, w>,
// w_e = E n_e / N^2. The chunked trainer tallies n, S and N over the chunks' forwards (stage 1),
// then each chunk's backward adds sum_rows <P_row, w> over its rows (Weigh); a forward that
// tallies with its graph (the last chunk's, when stage 1 skipped it; a whole-sequence forward)
// takes Loss()'s gradient instead. transformers takes the softmax in the model's dtype (bfloat16
// for bfloat16 models); the two agree for float32 and float64 models.
struct RouterBalance {
  // A forward's sparse layers add their rows here (ChunkInput::balance): before Weigh,
  // to the tally (with their graph where the forward has one); after, to `term`.
  void Add(const at::Tensor& probs, const at::Tensor& counts);  // [C, E] probabilities, [E] top-k choices
  at::Tensor Loss() const;  // aux of the rows tallied, a scalar (undefined before any)
  // Fixes w from the tally, and `value`: the rows added from here add sum <P_row, w> to `term`.
  void Weigh();
  bool weighed() const { return weights.defined(); }

  at::Tensor counts, prob_sums;  // [E] float64: n and S
  int64_t rows = 0;              // N
  at::Tensor weights;            // [E] float64: w, once weighed
  at::Tensor value;              // aux of the tally, once weighed (no graph; on the device)
  at::Tensor term;               // sum <P_row, w> over the rows added since weighed (or reset)
};

// How a sparse layer computes its experts. kLoop: a loop over the experts hit, a few kernels per
// expert, the routing's counts read on the host once per layer. kGrouped: grouped GEMMs over
// every expert at once (kernels::GroupedMatmul; one kernel per product, LoRA's included, nothing
// read on the host). kAuto: grouped on a GPU where that is one kernel (GroupedMatmulIsNative),
// in bfloat16 or float16 with sizes it takes, the loop elsewhere (the CPU, float64). Both give
// the same values up to the order of additions.
enum class ExpertKernel { kAuto, kLoop, kGrouped };

// How one forward runs a sparse layer's experts.
struct ExpertRun {
  ExpertKernel kernel = ExpertKernel::kLoop;  // resolved: kLoop or kGrouped
  bool recompute_gate_up = false;             // kernels::GroupedExpertMlp recomputes gate_up in backward
  RouterBalance* balance = nullptr;           // where the routing is tallied, or none
};

struct ExpertMlp {
  at::Tensor router, router_bias;  // [E, hidden], [E] (MoeSpec::biases) or undefined
  ExpertBank gate_up, down;

  // The experts' output over the input norm's output y [C, hidden] (in the column region), this
  // rank's partial sum under tensor parallelism (the caller sums it over the group).
  at::Tensor Forward(const BlockContext& ctx, const MoeSpec& moe, const ExpertRun& run, const at::Tensor& y) const;

 private:
  // The experts' MLPs over the pairs x [M, hidden] sorted by expert, `counts` [E] of each, each
  // pair's output times its routing weight scale [M] (ExpertKernel's two ways): `rows`, and where
  // the down projection's LoRA update is kept apart (the grouped way's: FromPairs adds it in its
  // sum, where adding it to the product would write a pair-wide tensor more), `lora`.
  struct PairOutputs {
    at::Tensor rows, lora;
  };
  PairOutputs Loop(const BlockContext& ctx, const MoeSpec& moe, const at::Tensor& x, const at::Tensor& counts,
                   const at::Tensor& scale) const;
  PairOutputs Grouped(const BlockContext& ctx, const MoeSpec& moe, const at::Tensor& x, const at::Tensor& counts,
                      const at::Tensor& scale) const;
};

// kAuto's choice for a model of `config` in `dtype` on `device`, sharded over `tp_size` ranks,
// with the banks' LoRA ranks `lora_ranks` (ExpertPathTarget and RunsGroupedExperts, the
// planner's too); `asked` itself when not kAuto.
ExpertKernel ChooseExpertKernel(ExpertKernel asked, const ModelConfig& config, at::ScalarType dtype,
                                const at::Device& device, int tp_size, const std::vector<int64_t>& lora_ranks);

}  // namespace oomb

#endif  // OOMB_WORKER_MODEL_EXPERT_MLP_H_
