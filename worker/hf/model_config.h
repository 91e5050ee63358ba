// A decoder-only model's architecture, read from a Hugging Face config.json. Torch-free.
//
// Supported: LlamaForCausalLM (Llama 2/3/3.1, SmolLM2), Qwen2ForCausalLM (Qwen2, Qwen2.5),
// Qwen3ForCausalLM (Qwen3 dense), Qwen3MoeForCausalLM, MixtralForCausalLM and GptOssForCausalLM
// (mixtures of experts), MistralForCausalLM (with its sliding window),
// Gemma3ForCausalLM (local and global layers; also the text part of a
// Gemma3ForConditionalGeneration config) and Phi3ForCausalLM (Phi-3, Phi-4-mini: fused
// projections, longrope, partial rotary).
// RoPE scaling is read from `rope_parameters` (transformers >= 5) or `rope_scaling` +
// `rope_theta` (earlier versions), so configs written by either load.
#ifndef OOMB_WORKER_HF_MODEL_CONFIG_H_
#define OOMB_WORKER_HF_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/common/file_access.h"

namespace oomb {

// The largest position count a config.json may give (max_position_embeddings, sliding_window,
// original_max_position_embeddings): far beyond any real model's, small enough to size with.
inline constexpr int64_t kMaxPositionEmbeddings = int64_t{1} << 30;

enum class RopeType { kDefault, kLinear, kDynamic, kYarn, kLlama3, kLongrope };

// "default", "linear", "dynamic", "yarn", "llama3", "longrope": config.json's spelling.
const char* RopeTypeName(RopeType type);

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // yarn, llama3, longrope
  double low_freq_factor = 1.0;                  // llama3
  double high_freq_factor = 4.0;                 // llama3
  double beta_fast = 32.0;                       // yarn
  double beta_slow = 1.0;                        // yarn
  double attention_factor = 0.0;                 // yarn, longrope; 0: derived from factor (and mscale)
  double mscale = 0.0;                           // yarn
  double mscale_all_dim = 0.0;                   // yarn
  bool truncate = true;                          // yarn
  // longrope (Phi-3): the inverse frequencies are divided by long_factor when the sequence is
  // longer than original_max_position_embeddings, else by short_factor; rotary_dim / 2 each.
  std::vector<double> short_factor, long_factor;
};

// A mixture-of-experts MLP (Qwen3-MoE, Mixtral, gpt-oss): a router (a linear layer, one output
// per expert) scores each token, softmax over the experts in float32, the top_k experts run
// (gated SwiGLU MLPs of `intermediate` features) and their outputs are summed weighted by those
// probabilities, renormalised to sum 1 over the top_k when `renormalize` (gpt-oss's softmax over
// the top_k logits is that renormalisation).
struct MoeConfig {
  int64_t experts = 0;  // 0: every layer's MLP is dense
  int64_t top_k = 0;
  int64_t intermediate = 0;
  bool renormalize = false;
  // The routing weights multiply in float32 (Mixtral) rather than in the model's dtype
  // (Qwen3-MoE), as transformers does for each (transformers multiplies the experts' outputs;
  // oomb their activations, before the linear down projection: ExpertMlp::Forward, worker/model/expert_mlp.h).
  bool float_scores = false;
  std::vector<bool> layers = {};  // which layers are sparse (the others keep the dense MLP)
  // The router's auxiliary load-balancing loss enters the training loss times this
  // (router_aux_loss_coef, when config.json's output_router_logits is true; else 0: none).
  // RouterBalance (worker/model/transformer.h) says what the loss is.
  double aux_loss_coef = 0;
  // Where the checkpoint keeps a sparse layer's MLP under model.layers.{i}.: "mlp" (Qwen3-MoE)
  // or "block_sparse_moe" (Mixtral); its router is <block>.gate.weight and expert e's gate, up
  // and down projections <block>.experts.{e}.<name>.weight with these names.
  std::string stored_block = "mlp";
  std::vector<std::string> stored_projections = {"gate_proj", "up_proj", "down_proj"};
  // gpt-oss's experts. `biases`: the router has a bias (mlp.router.bias) and so has each expert's
  // projections (mlp.experts.gate_up_proj_bias [E, 2 intermediate], down_proj_bias [E, hidden]).
  // `swiglu_limit` > 0: the clamped SwiGLU over gate_up_proj's interleaved rows (gate the even,
  // up the odd ones), (clamp(up, -limit, limit) + 1) * g * sigmoid(swiglu_alpha * g) with
  // g = min(gate, limit); 0: SwiGLU over its halves (gate's rows first).
  // `stored_banks`: the checkpoint keeps each bank whole as transformers holds it, [E, in, out]
  // (mlp.experts.gate_up_proj, or MXFP4's gate_up_proj_blocks and _scales, dequantized at load),
  // its router as mlp.router, rather than each expert's projections.
  bool biases = false;
  double swiglu_limit = 0;
  double swiglu_alpha = 0;
  bool stored_banks = false;
};

struct ModelConfig {
  // "LlamaForCausalLM" | "Qwen2ForCausalLM" | "Qwen3ForCausalLM" | "Qwen3MoeForCausalLM" |
  // "MixtralForCausalLM" | "GptOssForCausalLM" | "MistralForCausalLM" | "Gemma3ForCausalLM" |
  // "Phi3ForCausalLM"; a
  // Gemma3ForConditionalGeneration checkpoint is read as the Gemma3ForCausalLM of its text_config, with multimodal_text
  // set.
  std::string architecture;
  // "llama" | "qwen2" | "qwen3" | "qwen3_moe" | "mixtral" | "gpt_oss" | "mistral" | "gemma3_text" |
  // "phi3"
  std::string model_type;
  // The model is the language model of a vision-language checkpoint (Gemma3ForConditionalGeneration),
  // whose vision tower is left alone: its weights sit under language_model.model. (or
  // model.language_model.), PEFT names its modules model.language_model.*, and it trains with
  // LoRA only (full fine-tuning would write a model without its vision tower).
  bool multimodal_text = false;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  // RoPE rotates the first rope_dim() features of each head: partial_rotary_factor x head_dim
  // (Phi-4-mini); 0: all of them.
  int64_t rotary_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2: true; Llama, Qwen3: config's attention_bias
  bool o_bias = false;    // Llama's attention_bias also biases o_proj
  bool mlp_bias = false;
  bool qk_norm = false;  // Qwen3: an RMSNorm over each head of q and of k, before RoPE
  // gpt-oss: each head's softmax has one more logit, self_attn.sinks [num_heads], whose value is
  // zero (kernels/torch/paged_attention.h).
  bool attention_sinks = false;
  // Phi-3: q, k and v are one linear layer (qkv_proj, rows in that order), gate and up another
  // (gate_up_proj, gate's rows first); LoRA adapts the fused layers as PEFT names them.
  bool fused_projections = false;
  // Sliding-window attention (Mistral's sliding_window, Gemma 3's local layers): in the layers
  // marked here, query i sees only keys j > i - sliding_window (transformers' sliding-window
  // mask); empty: none.
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;
  // Gemma 3's layer: every RMSNorm scales by 1 + weight, in float32; the attention's and the
  // MLP's outputs are normed too (post_attention_layernorm, post_feedforward_layernorm; the MLP's
  // input norm is pre_feedforward_layernorm); embeddings are scaled by sqrt(hidden_size); the MLP
  // gates with GELU (tanh approximation).
  bool gemma_layers = false;
  // Attention scores are scaled by query_pre_attn_scalar^-1/2 (Gemma); 0: head_dim^-1/2.
  double query_pre_attn_scalar = 0;
  RopeConfig rope;
  // The RoPE of the sliding-window layers when it is not `rope` (Gemma 3's local base).
  std::optional<RopeConfig> sliding_rope;
  MoeConfig moe;
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  std::string torch_dtype;  // as written in config.json ("float32", "bfloat16", ...)

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t rope_dim() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
  // Parameters of the base model (LoRA excluded), as DescribeModel's layers count them
  // (worker/hf/layer_spec.h).
  int64_t ParameterCount() const;
};

// RoPE scaling a job asks for over config.json's (the job spec's model.rope_scaling): what is
// unset takes the model's value (original_max_position_embeddings: its own, else
// max_position_embeddings) or the method's default.
struct RopeScalingOverride {
  RopeType type = RopeType::kLinear;
  std::optional<double> factor;
  std::optional<int64_t> original_max_position_embeddings;
  std::optional<double> low_freq_factor, high_freq_factor, beta_fast, beta_slow;
};

// `config` with `scaling` applied to its RoPE.
ModelConfig ApplyRopeScaling(ModelConfig config, const RopeScalingOverride& scaling);

// Parses config.json text. INVALID_ARGUMENT naming the key for missing or malformed keys;
// UNIMPLEMENTED naming the architecture or rope type that is not supported. `source` names
// the file in messages.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source);

// Reads and parses config.json of the model directory.
absl::StatusOr<ModelConfig> LoadModelConfig(const Dir& model_dir);

// The config.json of the model as trained: `base_config_json` (the base model's config.json)
// with `effective`'s RoPE written as both `rope_parameters` (transformers >= 5) and
// `rope_scaling` (earlier versions; transformers 5 reads it first), `rope_theta`, and
// `max_position_embeddings` raised to the extended window (factor x original window) for
// linear, yarn and llama3 scaling (dynamic scaling keeps the base window, which its formula
// uses). Every other key is kept as it is. A default RoPE leaves the text's RoPE keys alone.
absl::StatusOr<std::string> EffectiveConfigJson(const std::string& base_config_json, const ModelConfig& effective,
                                                const std::string& source);

// The RoPE scaling that turns a base model's config into `trained` (read back from an
// effective config.json); none when `trained` has a default RoPE.
std::optional<RopeScalingOverride> RopeScalingOf(const RopeConfig& trained);

// The RoPE scaling an adapter oomb wrote was trained with, from the base config recorded beside
// it (kBaseConfigFile, worker/hf/loading_code.h); none for an adapter without one.
absl::StatusOr<std::optional<RopeScalingOverride>> AdapterRopeScaling(const Dir& adapter);

}  // namespace oomb

#endif  // OOMB_WORKER_HF_MODEL_CONFIG_H_
