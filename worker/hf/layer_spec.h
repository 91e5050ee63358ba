// The layers of a decoder-only model as the engine builds them: the one description that the
// transformer's forward (worker/model/transformer.h), the memory planner's count of what that
// forward keeps (worker/plan/memory_planner.cc), the step-time estimate and the FLOP count read.
// None of them interprets a family's config.json flags: DescribeModel does, once. Torch-free.
//
// A layer is: input norm -> attention (q, k, v projections, optional per-head q/k norms, RoPE,
// causal attention within its window, o projection) [-> output norm] -> residual -> MLP input
// norm -> gated MLP (gate, up, down) [-> output norm] -> residual.
#ifndef OOMB_WORKER_HF_LAYER_SPEC_H_
#define OOMB_WORKER_HF_LAYER_SPEC_H_

#include <cstdint>
#include <string>
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

  int64_t Parameters() const { return in * out + (bias ? out : 0); }
};

struct LayerSpec {
  int64_t window = 0;       // sliding window: query i sees keys j > i - window; 0: the whole past
  bool local_rope = false;  // rotates with ModelConfig::sliding_rope (Gemma 3's local layers)
  // q, k and v are one linear layer (qkv_proj, rows in that order) and gate and up another
  // (gate_up_proj, gate's rows first), split as transformers splits them (Phi-3).
  bool fused_projections = false;
  MlpKind mlp = MlpKind::kSwiGlu;
  std::vector<NormSpec> norms;      // in the checkpoint's order
  std::vector<LinearSpec> linears;  // in the forward's order

  bool Has(NormRole role) const;
  // The norms of hidden_size (not the per-head ones).
  int64_t HiddenNorms() const;
  // Its weights: the norms', the linear layers' weights and biases.
  int64_t Parameters() const;
  // The query-key pairs its attention sees over a sequence of `tokens`, per query feature:
  // T^2 / 2 over the whole past, W T - W^2 / 2 within a window of W < T.
  double AttentionPairs(int64_t tokens) const;
  // Its model FLOPs of training over a sequence of `tokens` (forward and backward, counted once):
  // 6 per weight per token, and 12 per query-key pair per query feature (`q_dim`).
  double TrainingFlops(int64_t q_dim, int64_t tokens) const;
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
  // norms, linear weights and biases, the final norm.
  int64_t ParameterCount(const ModelConfig& c) const;
  // Model FLOPs of training one sequence of `tokens`, block by block (what MFU divides,
  // worker/metrics/flops.h): every layer's TrainingFlops, and 6 per weight per token for the
  // embeddings, the LM head and the final norm. In all: 6 N T + 12 d P (N = ParameterCount,
  // d = q_dim, P the pairs summed over the layers). The trainer's recomputation and LoRA's
  // matmuls are not model FLOPs.
  double TrainingFlops(const ModelConfig& c, int64_t tokens) const;
};

// The layers of the model `c` describes.
ModelSpec DescribeModel(const ModelConfig& c);

// The linear layers of a decoder layer (the first; every layer has the same), in the forward's order.
std::vector<LinearSpec> LinearLayers(const ModelConfig& c);

// `targets` (a job's method.lora.target_modules) as this model's linear layer names, in the
// order of LinearLayers. On a model with fused projections, q_proj, k_proj and v_proj together
// name qkv_proj and gate_proj with up_proj names gate_up_proj. INVALID_ARGUMENT naming the
// field for a module the model does not have, or for part of a fused layer.
absl::StatusOr<std::vector<std::string>> ResolveLoraTargets(const ModelConfig& c,
                                                            const std::vector<std::string>& targets);

}  // namespace oomb

#endif  // OOMB_WORKER_HF_LAYER_SPEC_H_
