// The layers of a decoder-only model as the engine builds them: the one description that the
// transformer's forward (worker/model/transformer.h), the memory planner (what each block keeps
// for backward, declared here), the step-time estimate and the FLOP count read.
// None of them interprets a family's config.json flags: DescribeModel does, once. Torch-free.
//
// A layer is: input norm -> attention (q, k, v projections, optional per-head q/k norms, RoPE,
// causal attention within its window, o projection) [-> output norm] -> residual -> MLP input
// norm -> gated MLP (gate, up, down), or a mixture of such MLPs behind a router (MoeSpec)
// [-> output norm] -> residual.
#ifndef OOMB_WORKER_HF_LAYER_SPEC_H_
#define OOMB_WORKER_HF_LAYER_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/hf/model_config.h"

namespace oomb {

// How every RMSNorm of the model scales: by its weight (Llama, Qwen, Mistral, Phi-3), or by
// 1 + weight computed in float32 (Gemma 3).
enum class NormKind { kRms, kRmsOnePlusWeight };

// The MLP's gated activation: silu(gate) * up (SwiGLU), or gelu_tanh(gate) * up (Gemma 3).
enum class MlpKind { kSwiGlu, kGeluTanhGlu };

// What a norm of a decoder layer normalises.
enum class NormRole {
  kInput,            // the attention's input (input_layernorm)
  kAttentionOutput,  // the attention's output, before the residual (Gemma 3's post_attention_layernorm)
  kMlpInput,         // the MLP's input (post_attention_layernorm; Gemma 3's pre_feedforward_layernorm)
  kMlpOutput,        // the MLP's output, before the residual (Gemma 3's post_feedforward_layernorm)
  kQuery,            // each head of q, before RoPE (Qwen3, Gemma 3: self_attn.q_norm)
  kKey,              // each head of k, before RoPE (self_attn.k_norm)
};

struct NormSpec {
  NormRole role;
  std::string name;  // the weight's name under model.layers.{i}. ("input_layernorm.weight")
  int64_t size;      // hidden_size, or head_dim for the per-head norms
};

// One linear layer: its module name as PEFT targets it (q_proj, qkv_proj, ...), whether it sits
// in self_attn (else mlp), its input and output features, and whether it has a bias.
struct LinearSpec {
  std::string name;
  bool attention;
  int64_t in, out;
  bool bias;
  // How tensor parallelism splits it (worker/model/tensor_parallel.h): a row-parallel layer
  // (o_proj, down_proj) its input features, the others (column-parallel) their output features;
  // `parts`: the sizes of the split dimension's parts, each split evenly over the ranks (a fused
  // projection's: q, k, v or gate, up).
  bool row_parallel = false;
  std::vector<int64_t> parts = {};

  int64_t Parameters() const { return in * out + (bias ? out : 0); }
};

// One projection of every expert of a mixture-of-experts MLP, a [experts, out, in] tensor as
// transformers holds it (mlp.experts.<name>; gpt-oss holds its transpose) and PEFT's
// target_parameters adapt it: gate_up_proj (gate's rows first, then up's; gpt-oss's interleaved)
// and down_proj.
struct ExpertBankSpec {
  std::string name;
  int64_t experts, in, out;
  // As LinearSpec's: down_proj is row-parallel; gate_up_proj's parts are gate's and up's rows
  // (one part where they are interleaved, its pairs staying together).
  bool row_parallel = false;
  std::vector<int64_t> parts = {};

  int64_t Parameters() const { return experts * in * out; }
};

// A mixture-of-experts MLP (MoeConfig, worker/hf/model_config.h): the router mlp.gate.weight
// [experts, hidden] (gpt-oss: mlp.router, with a bias) and the expert banks; each token runs
// top_k experts.
struct MoeSpec {
  int64_t experts = 0, top_k = 0, hidden = 0, intermediate = 0;
  bool renormalize = false;
  bool float_scores = false;
  bool biases = false;  // the router's and the experts' (MoeConfig::biases)
  // The clamped SwiGLU over interleaved rows when swiglu_limit > 0 (MoeConfig).
  double swiglu_limit = 0, swiglu_alpha = 0;

  // gate_up_proj and down_proj, in the forward's order.
  std::vector<ExpertBankSpec> Banks() const;
  int64_t Parameters() const;        // the router's and every expert's
  int64_t ActiveParameters() const;  // the router's and top_k experts': what one token computes with
};

// An expert bank LoRA adapts (ExpertBankSpec::name) and the multiple of method.lora.rank and
// alpha its adapter has: PEFT fuses the adapters of gate_proj and up_proj that target_modules
// names into one on gate_up_proj of twice the rank and alpha (its rank_pattern and
// alpha_pattern), as transformers fuses the weights; 1 otherwise.
struct ExpertLoraTarget {
  std::string bank;
  int64_t rank_factor = 1;
};

// How the layers run, for what their blocks keep for backward: model.dtype's element size,
// whether the fused layer kernels run (kernels/torch/layer_ops.h: a bfloat16 / float16 model on
// a GPU) and whether the RMSNorms do (frozen weights: on a GPU, or the 1 + weight norm on every
// device), and LoRA's adapters.
struct Execution {
  int64_t elem_bytes = 2;
  bool fused_kernels = false;
  bool fused_norms = false;
  // A mixture of experts' MLP on grouped products (ExpertKernel::kGrouped, which kAuto takes on
  // a GPU of compute capability 9.0 or more): with LoRA and without biases one autograd function
  // (kernels/torch/expert_ops.h GroupedExpertMlp).
  bool grouped_experts = false;
  // Of those layers, how many (the first) recompute the experts' gate_up product in backward
  // (Transformer::set_expert_recompute_layers).
  int64_t expert_recompute_layers = 0;
  int64_t lora_rank = 0;  // 0: no LoRA (full fine-tuning)
  double lora_dropout = 0;
  std::vector<std::string> lora_targets;              // ResolveLoraTargets' names
  std::vector<ExpertLoraTarget> lora_expert_targets;  // ResolveLoraExpertTargets
};

struct LayerSpec {
  int64_t window = 0;       // sliding window: query i sees keys j > i - window; 0: the whole past
  int64_t sinks = 0;        // self_attn.sinks: a sink logit per query head (gpt-oss); 0: none
  bool local_rope = false;  // rotates with ModelConfig::sliding_rope (Gemma 3's local layers)
  // q, k and v are one linear layer (qkv_proj, rows in that order) and gate and up another
  // (gate_up_proj, gate's rows first), split as transformers splits them (Phi-3).
  bool fused_projections = false;
  MlpKind mlp = MlpKind::kSwiGlu;
  std::vector<NormSpec> norms;      // in the checkpoint's order
  std::vector<LinearSpec> linears;  // in the forward's order; of a mixture of experts, attention's only
  std::optional<MoeSpec> moe;       // the MLP is a mixture of experts

  bool Has(NormRole role) const;
  // The norms of hidden_size (not the per-head ones).
  int64_t HiddenNorms() const;
  // Its weights: the norms', the linear layers' weights and biases, the router's and experts'.
  int64_t Parameters() const;
  // The weights one token computes with: all but the experts it is not routed to.
  int64_t ActiveParameters() const;
  // The query-key pairs its attention sees over a sequence of `tokens`, per query feature:
  // T^2 / 2 over the whole past, W T - W^2 / 2 within a window of W < T.
  double AttentionPairs(int64_t tokens) const;
  // Its model FLOPs of training over a sequence of `tokens` (forward and backward, counted once):
  // 6 per active weight per token (ActiveParameters), and 12 per query-key pair per query
  // feature (`q_dim`).
  double TrainingFlops(int64_t q_dim, int64_t tokens) const;
  // Its linear layers that LoRA adapts: those `targets` names (ResolveLoraTargets' names).
  std::vector<LinearSpec> Adapted(const std::vector<std::string>& targets) const;
  // Its expert banks that LoRA adapts (ResolveLoraExpertTargets), with their rank factors.
  std::vector<std::pair<ExpertBankSpec, int64_t>> AdaptedExperts(const std::vector<ExpertLoraTarget>& targets) const;
  // What autograd keeps of it per token for backward (Transformer::Hidden), block by block:
  // with the composite ops (CPU, float32):
  //   each RMSNorm: the float32 upcast of the input and the normalised output (dtype); in
  //   full fine-tuning (lora_rank 0) also the normalised input before the weight (dtype)
  //   q, k before RoPE and their rotate_half (RoPE's multiplications save both)
  //   the SwiGLU MLP's gate, silu(gate), up and silu(gate) * up (gate and up only, below)
  //   (the clamped SwiGLU of gpt-oss's experts, on every path: its input and output)
  // with the fused kernels (Execution::fused_kernels; the RMSNorms when fused_norms):
  //   each RMSNorm: the input and the normalised output (dtype) and a float32 rstd a row
  //   nothing of RoPE's
  //   the MLP's gate, up and silu(gate) * up
  // and on every device (kernels/torch/layer_ops.h) the 1 + weight RMSNorm (NormKind, weights
  // frozen) as the fused one, and the GELU-tanh MLP's gate, up and gelu_tanh(gate) * up;
  // and either way:
  //   the attention's q, k (after RoPE), v, output and float32 log-sum-exp per head
  //   per-head q and k norms: the fused one keeps its input and a float32 rstd per head; the
  //   composite ops, as an RMSNorm above
  //   LoRA: the rank-r intermediate of each adapted linear; with dropout also the float32 keep
  //   mask and the dropped input
  //   with LoRA on down_proj and no dropout, of the MLP only gate and up, on every path: the
  //   activation is recomputed in backward (kernels::GluDownLora).
  // A mixture of experts instead of the MLP, on every path: the router's float32 probabilities
  // (E per token) and the top_k weights' sum, per (token, expert) pair its top-k weight before
  // and after renormalising, its index, position in the expert order and token (int64), its
  // gate_up product (the activation's input) and its weight; LoRA on a bank, the rank-r
  // intermediate (times its rank factor) per pair; and but in GroupedExpertMlp (grouped_experts,
  // LoRA, no biases), which gathers them again and recomputes it, each pair's input row (hidden)
  // and its activation (intermediate); there, with gate_up_recomputed, not the product either.
  int64_t SavedBytesPerToken(const ModelConfig& c, const Execution& x, bool gate_up_recomputed = false) const;
};

struct ModelSpec {
  NormKind norm = NormKind::kRms;
  bool scale_embeddings = false;  // the embeddings times sqrt(hidden_size) (Gemma 3)
  // q is multiplied by this after RoPE, so that the attention's head_dim^-1/2 gives the model's
  // softmax scale (Gemma 3's query_pre_attn_scalar^-1/2); 1: none.
  double query_scale = 1.0;
  std::vector<LayerSpec> layers;

  // Every layer's window, in order (0: the whole past).
  std::vector<int64_t> Windows() const;
  bool HasWindows() const;
  // Whether a layer rotates with ModelConfig::sliding_rope.
  bool HasLocalRope() const;
  // Parameters of the base model (LoRA excluded): embeddings (twice when untied), every layer's
  // norms, linear weights and biases, routers and experts, the final norm.
  int64_t ParameterCount(const ModelConfig& c) const;
  // The weights one token computes with: ParameterCount less the experts it is not routed to
  // (the N of TrainingFlops).
  int64_t ActiveParameterCount(const ModelConfig& c) const;
  // Model FLOPs of training one sequence of `tokens`, block by block (what MFU divides,
  // worker/metrics/flops.h): every layer's TrainingFlops, and 6 per weight per token for the
  // embeddings, the LM head and the final norm. In all: 6 N T + 12 d P (N = the active
  // parameters: ParameterCount less the experts a token is not routed to; d = q_dim, P the pairs
  // summed over the layers). The trainer's recomputation and LoRA's matmuls are not model FLOPs.
  double TrainingFlops(const ModelConfig& c, int64_t tokens) const;
  // What autograd keeps per token through every layer (LayerSpec::SavedBytesPerToken) and, once,
  // the final norm: what the memory planner counts of a chunk's graph.
  int64_t SavedBytesPerToken(const ModelConfig& c, const Execution& x) const;
};

// The layers of the model `c` describes.
ModelSpec DescribeModel(const ModelConfig& c);

// The linear layers of the decoder layers, each name once, in the forward's order (a model
// whose dense and sparse layers differ: the attention's, then the dense MLP's).
std::vector<LinearSpec> LinearLayers(const ModelConfig& c);

// `targets` (a job's method.lora.target_modules) as this model's linear layer names, in the
// order of LinearLayers. On a model with fused projections, q_proj, k_proj and v_proj together
// name qkv_proj and gate_proj with up_proj names gate_up_proj. INVALID_ARGUMENT naming the
// field for a module the model does not have, or for part of a fused layer. On a mixture of
// experts the MLP's names mean what they mean to PEFT 0.22 under transformers 5: the expert
// banks (all of a bank's parts, ExpertBankParts; ResolveLoraExpertTargets gives the banks) and,
// where the model has dense layers (Qwen3-MoE's mlp_only_layers), those layers' MLP linears of
// the same names too. (PEFT 0.21 read them as the banks alone; SaveLora writes adapters both
// read alike, worker/model/transformer.h.)
absl::StatusOr<std::vector<std::string>> ResolveLoraTargets(const ModelConfig& c,
                                                            const std::vector<std::string>& targets);

// On a mixture-of-experts model, the MLP's linear layer names that stand for each expert bank:
// its family's own (PEFT converts them: Qwen3-MoE's gate_proj with up_proj for gate_up_proj,
// down_proj for down_proj; Mixtral's w1 with w3, w2), then the common ones (gate_proj, up_proj,
// down_proj) where they differ; none on a dense model.
std::vector<std::pair<std::string, std::vector<std::string>>> ExpertBankParts(const ModelConfig& c);

// The expert banks LoRA adapts, in the forward's order: those `targets`
// (a job's method.lora.target_parameters, PEFT's target_parameters) name, each by its parameter
// name or a suffix of it at a dot ("mlp.experts.gate_up_proj", "experts.down_proj",
// "gate_up_proj"), and those whose parts (ExpertBankParts) `modules` (target_modules) all name,
// so that the MLP names adapt the experts of a sparse layer as they adapt a dense one.
// INVALID_ARGUMENT naming the field for a target that names no parameter of the model (a dense
// model has none), and for a `dropout` above 0 with a bank adapted (PEFT takes none there).
absl::StatusOr<std::vector<ExpertLoraTarget>> ResolveLoraExpertTargets(const ModelConfig& c,
                                                                       const std::vector<std::string>& modules,
                                                                       const std::vector<std::string>& targets,
                                                                       double dropout);

// Whether tensor parallelism over `ranks` can split the model (worker/model/tensor_parallel.h):
// the heads, the KV heads and the MLP's (and experts') intermediate features each a multiple of
// it. INVALID_ARGUMENT naming the config.json key that is not.
absl::Status CheckTensorParallel(const ModelConfig& c, int ranks);

// One rank's share of the model under tensor parallelism over `ranks` (CheckTensorParallel
// holding): the config whose layers have that rank's shapes — 1/ranks of the heads, the KV
// heads, the MLP's and the experts' intermediate features, and of the vocabulary (rounded up: the
// first ranks' share). Its layers' weights, LoRA factors, KV pages and activations are the
// rank's (a column-parallel layer's replicated A and a row-parallel one's replicated B
// included); what the memory planner plans a rank with.
ModelConfig ShardConfig(const ModelConfig& c, int ranks);

// Where a mixture of experts' sparse layers run their experts: the one choice the model
// (ExpertKernel::kAuto, worker/model/expert_mlp.h) and the memory planner both take. Grouped
// GEMMs where they are one kernel (kernels::GroupedMatmul: a GPU of compute capability 9.0 or
// more), in bfloat16 or float16, with every inner size a multiple of 16 bytes; the loop over the
// experts hit elsewhere (an older GPU, the CPU, float32 and float64).
struct ExpertPathTarget {
  bool cuda = false;
  int compute_capability = 0;   // major * 10 + minor (90: Hopper); 0 unknown
  bool half_precision = false;  // bfloat16 or float16
  int64_t elem_bytes = 2;
};
bool RunsGroupedExperts(const ExpertPathTarget& target, const std::vector<int64_t>& inner_sizes);
// The grouped products' inner sizes of a model sharded over `tp_size` ranks: hidden, the experts'
// intermediate features per rank, and each adapted bank's LoRA rank.
std::vector<int64_t> ExpertInnerSizes(const ModelConfig& c, int tp_size, const std::vector<int64_t>& lora_ranks);

}  // namespace oomb

#endif  // OOMB_WORKER_HF_LAYER_SPEC_H_
