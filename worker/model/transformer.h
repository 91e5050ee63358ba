// The decoder-only transformer (Llama, Qwen2, Qwen3, Qwen3-MoE, Mixtral, gpt-oss, Mistral, Gemma 3
// and Phi-3 families) on LibTorch, with LoRA.
//
// One model serves training and inference: a forward pass runs over one chunk of one sequence,
// and attention is a callback, so the chunk-recurrent trainer routes it through the paged KV
// cache (kernels/torch/paged_attention.h) while a plain full-sequence forward (evaluation,
// `oombd model eval`, tests) uses the same callback with no past.
//
// Numerics follow transformers (modeling_llama / _qwen2 / _qwen3 / _mistral / _gemma3 / _phi3 /
// _qwen3_moe / _mixtral / _gpt_oss):
// RMSNorm in float32 (float64 for float64 models), RoPE tables from float32 inverse frequencies
// (rope types default, linear, dynamic, yarn, llama3, longrope, as modeling_rope_utils computes
// them) over the first rotary_dim features of a head, SwiGLU MLP, q/k/v biases for Qwen2, an
// RMSNorm over each head of q and k before RoPE for Qwen3 and Gemma 3, softmax scale
// 1/sqrt(head_dim) (Gemma 3: query_pre_attn_scalar), Gemma 3's layer,
// Phi-3's fused projections split as transformers splits them; a mixture of experts as
// transformers' Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock (softmax over the router's logits
// in float32, float64 for float64 models, top-k, renormalised where the family does; each
// expert's SwiGLU over its tokens, weighted and summed; oomb weights the activation before the
// down projection, kernels/torch/expert_ops.h), and gpt-oss's (the router's and the
// experts' biases, its clamped SwiGLU; its attention sinks enter the attention callback).
// Experts run as one loop over the experts hit, or grouped GEMMs (ExpertKernel), their tokens
// gathered once per layer and chunk in expert order.
//
// LoRA (PEFT semantics): y = x W^T + b + (dropout(x) A^T B^T) * alpha / r on the target
// modules; A is initialised like PEFT (kaiming-uniform, a = sqrt(5)), B with zeros. LoRA
// parameters are kept in float32 for bfloat16 models (float64 for float64 models). On an expert
// bank (PEFT's target_parameters: a ParamWrapper over mlp.experts.<bank>), one A of [E r, in]
// and one B of [out, r E] hold every expert's: expert e's update is B[:, k E + e] A[e r + k]
// summed over k, times alpha / r, as PEFT lays them out; applied per expert to its tokens,
// never as a weight. PEFT takes no dropout there.
//
// Tensor parallelism (Shard; the layout in worker/model/tensor_parallel.h): a model sharded over
// a group keeps its rank's heads, intermediate features and vocabulary rows, and its forward
// takes the group's collectives (kernels/torch/tensor_parallel.h): the attention callback sees
// the rank's heads alone.
//
// Where each part lives: the model composes its layers (embedding, decoder layers, final norm,
// LM head) and owns loading, saving, adapters and sharding; each layer's blocks are types of
// their own (decoder_layer.h: attention.h, dense_mlp.h, expert_mlp.h), built on the linear layer
// (linear.h: base product, LoRA, its split and collective) and RoPE (rope.h).
//
// Thread-safety: a Transformer is used by one training thread at a time.
#ifndef OOMB_WORKER_MODEL_TRANSFORMER_H_
#define OOMB_WORKER_MODEL_TRANSFORMER_H_

#include <ATen/ATen.h>

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/hf/layer_spec.h"
#include "worker/hf/model_config.h"
#include "worker/model/block_context.h"
#include "worker/model/decoder_layer.h"
#include "worker/model/tensor_parallel.h"

namespace oomb {

struct LoraOptions {
  int64_t rank = 16;
  double alpha = 32;
  double dropout = 0.0;
  std::vector<std::string> target_modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};
  // Expert banks (ResolveLoraExpertTargets, worker/hf/layer_spec.h), beside those the MLP names
  // in target_modules stand for.
  std::vector<std::string> target_parameters = {};
  // An expert bank's rank and alpha where they are not rank and alpha times its rank factor
  // (ExpertLoraTarget), by bank name: PEFT's rank_pattern and alpha_pattern of a loaded adapter.
  // After AddLora: every adapted bank's whose rank is not `rank`.
  std::map<std::string, int64_t> bank_ranks = {};
  std::map<std::string, double> bank_alphas = {};
};

// The inputs of one forward pass over one chunk (C tokens) of one sequence.
struct ChunkInput {
  at::Tensor ids;        // [C] int64 token ids
  at::Tensor positions;  // [C] int64 RoPE positions (restart at 0 for each packed document)
  at::Tensor doc_start;  // [C] int64 global index of each token's document start
  // Dynamic NTK RoPE only: the sequence length the frequencies are computed for (the whole
  // sequence's largest position + 1, as transformers does for a full-sequence forward).
  int64_t rope_seq_len = 0;
  // Dropout of LoRA inputs: a generator seeded identically for a chunk's first forward and its
  // recomputation gives identical masks. Unused when dropout is 0 or `training` is false.
  bool training = false;
  uint64_t dropout_seed = 0;
  // Where the sparse layers add their routing, when the router's auxiliary loss is computed.
  RouterBalance* balance = nullptr;
};

// attention(layer, q [C, heads, D], k [C, kv_heads, D], v [C, kv_heads, D]) -> [C, heads, D];
// q and k are after RoPE. A layer with sinks (Transformer::sinks) attends with them
// (kernels::PagedAttention's `sinks`).
using AttentionFn =
    std::function<at::Tensor(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)>;

// Which trainable modules the gradients of a step reached (Transformer::GradientReach), by
// module across layers ("self_attn.q_proj", "mlp.experts.gate_up_proj", "embed_tokens"): a LoRA
// pair counts once and its B decides (at a run's first step A's gradient is zero, B being zero);
// a weight of full fine-tuning counts alone. On an expert bank, each expert's share is counted
// too: an expert no token was routed to receives nothing. What a job reports after its first
// step, the silent failure it catches being an adapter whose targets the training never reaches.
struct GradientReach {
  struct Group {
    std::string name;
    int64_t modules = 0, reached = 0;          // across layers
    int64_t experts = 0, experts_reached = 0;  // expert banks: experts across layers
  };
  std::vector<Group> groups;  // in the model's order

  bool every() const;  // every module and every expert reached
  // "self_attn.q_proj 24/24, mlp.experts.gate_up_proj 24/24 (experts 1530/1536)".
  std::string Describe() const;
};

class Transformer {
 public:
  // Loads config.json and the safetensors weights of a Hugging Face directory, converting to
  // `dtype` on `device`. Missing or unexpected tensor names, and shape mismatches, are
  // INVALID_ARGUMENT naming the tensor. `rope_scaling` applies over config.json's RoPE.
  // `tensor_parallel`: the model comes sharded over that group (as Shard leaves it), each tensor
  // split as it is read, so the device holds the rank's share and one whole tensor at most.
  static absl::StatusOr<std::unique_ptr<Transformer>> Load(const Dir& model_dir, at::ScalarType dtype,
                                                           at::Device device,
                                                           const std::optional<RopeScalingOverride>& rope_scaling = {},
                                                           const kernels::Collectives* tensor_parallel = nullptr);
  // A model with random weights (normal, std `init_std`), for tests and benchmarks;
  // `tensor_parallel`: sharded over that group as each tensor is drawn (Shard's layout; the
  // device holds one whole tensor at most beside the rank's share).
  static std::unique_ptr<Transformer> Random(const ModelConfig& config, at::ScalarType dtype, at::Device device,
                                             uint64_t seed, double init_std = 0.02,
                                             const kernels::Collectives* tensor_parallel = nullptr);

  // A copy of the model (base weights and adapters) in another dtype, on the same device.
  std::unique_ptr<Transformer> CastTo(at::ScalarType dtype) const;

  const ModelConfig& config() const { return config_; }
  // Its layers as the forward builds them (DescribeModel(config())).
  const ModelSpec& spec() const { return spec_; }
  at::ScalarType dtype() const { return dtype_; }
  at::Device device() const { return device_; }

  // Adds LoRA adapters (PEFT initialisation, seeded) and freezes the base weights; the targets
  // are resolved to the model's layers (ResolveLoraTargets), as lora() then reports them.
  absl::Status AddLora(const LoraOptions& options, uint64_t seed);
  bool has_lora() const { return lora_.has_value(); }
  const std::optional<LoraOptions>& lora() const { return lora_; }
  // Loads adapter weights saved by SaveLora (or by PEFT) into the existing adapters.
  absl::Status LoadLoraWeights(const Dir& adapter);
  // Adds the adapters of a PEFT adapter directory with the options of its adapter_config.json
  // (r, lora_alpha, target_modules as ResolveLoraTargets reads them, target_parameters naming
  // expert banks or linear layers' weights, rank_pattern and alpha_pattern of the banks; PEFT's
  // defaults where absent) and loads their weights. INVALID_ARGUMENT for a config oomb cannot
  // follow (a weight named in some layers only), a tensor missing or of another shape, and a
  // tensor of the file that none of those adapters takes.
  absl::Status LoadAdapter(const Dir& adapter);
  // Writes adapter_model.safetensors + adapter_config.json into `dir` in PEFT's layout, a config
  // that PEFT 0.21 and 0.22 read alike: the expert banks in target_parameters
  // (mlp.experts.gate_up_proj, with rank_pattern and alpha_pattern where their rank is not r),
  // and on a mixture of experts the dense layers' MLP there too, as their weights
  // (mlp.down_proj.weight), since those PEFT versions read the MLP's names in target_modules
  // differently (ResolveLoraTargets); the other linear layers in target_modules.
  absl::Status SaveLora(const Dir& dir, const std::string& base_model_path) const;
  // Writes model.safetensors + config.json (full fine-tuning output) in the model's dtype;
  // `config_json` less its quantization_config (an MXFP4 checkpoint's banks are written
  // dequantized).
  absl::Status SaveFull(const Dir& dir, const std::string& config_json) const;

  // The router's auxiliary loss weight over config.json's (MoeConfig::aux_loss_coef; 0: none).
  void set_router_aux_loss_coef(double coef) { config_.moe.aux_loss_coef = coef; }

  // How the sparse layers compute their experts (default kAuto); kGrouped where the sizes or the
  // dtype do not suit grouped GEMMs fails the forward (kernels::GroupedMatmulTakes).
  void set_expert_kernel(ExpertKernel kernel) { expert_kernel_ = kernel; }
  // What the sparse layers run now: kLoop or kGrouped.
  ExpertKernel expert_kernel() const;
  // In the first n sparse layers that run kernels::GroupedExpertMlp (grouped, frozen banks
  // without biases), backward recomputes the experts' gate_up product rather than keeping it (the
  // memory plan's MemoryPlan::expert_recompute_layers; default 0).
  void set_expert_recompute_layers(int64_t n) { expert_recompute_layers_ = n; }

  // Full fine-tuning: every base weight trains (and no LoRA). Requires no adapters.
  void EnableFullFineTuning();

  // Tensor parallelism: keeps this rank's share of every weight and adapter (every rank of
  // `group` holds the same whole model before) and runs the forward with the group's
  // collectives. Call once the adapters exist (AddLora, LoadAdapter) or after
  // EnableFullFineTuning. INVALID_ARGUMENT naming the size that the group's size does not divide
  // (heads, KV heads, intermediate features). `group` must outlive the model.
  absl::Status Shard(const kernels::Collectives& group);
  // The group (nullptr without tensor parallelism), this rank's place in it.
  const kernels::Collectives* tensor_parallel() const { return tp_; }
  int tensor_parallel_rank() const { return tp_ == nullptr ? 0 : tp_->rank(); }
  int tensor_parallel_size() const { return tp_ == nullptr ? 1 : tp_->size(); }
  // This rank's query and KV heads (all of them without tensor parallelism).
  int64_t local_heads() const { return config_.num_heads / tensor_parallel_size(); }
  int64_t local_kv_heads() const { return config_.num_kv_heads / tensor_parallel_size(); }
  // How tensor parallelism splits `tensor`, one of the model's (by identity; Replicated for
  // any other).
  Split SplitOf(const at::Tensor& tensor) const;
  // The trainable parameters each rank holds a share of the gradient of (Split::kPartial): the
  // caller sums their gradients over the group after the backward, before the optimizer step.
  std::vector<at::Tensor> PartialGradients() const;
  // The whole model gathered from the group's ranks (weights, adapters, and the gradients of
  // those that have one), on every rank; every rank of the group must call it. What a sharded
  // model saves (SaveLora, SaveFull) and tests compare. Without tensor parallelism, a copy.
  // trainable_only: the trainable parameters alone (a LoRA model's base weights left
  // undefined: enough for SaveLora).
  std::unique_ptr<Transformer> Whole(bool trainable_only = false) const;

  // The LM head's summed cross-entropy over hidden [N, hidden] and labels [N]
  // (kernels::ChunkedLmHeadCrossEntropy; vocabulary-parallel under tensor parallelism), and its
  // per-token scores (kernels::LmHeadTokenScores).
  at::Tensor LmHeadLoss(const at::Tensor& hidden, const at::Tensor& labels, int64_t rows_per_block) const;
  std::pair<at::Tensor, at::Tensor> LmHeadScores(const at::Tensor& hidden, const at::Tensor& labels,
                                                 int64_t rows_per_block) const;

  // What the optimizer updates, with the names checkpoints use (HF / PEFT names).
  std::vector<std::pair<std::string, at::Tensor>> TrainableParameters() const;
  // Where the trainable parameters' gradients, as they are now (after a backward), are nonzero.
  GradientReach Reach() const;
  // Every base weight with its HF name (transformers' in-memory name: an expert bank is one
  // [E, out, in] tensor, mlp.experts.gate_up_proj, also for gpt-oss, which holds [E, in, out]).
  std::vector<std::pair<std::string, at::Tensor>> BaseParameters() const;
  // Every base weight under its name in the family's checkpoints, as views of BaseParameters:
  // an expert bank as each expert's projections (mlp.experts.{e}.gate_proj.weight; Mixtral's
  // block_sparse_moe.experts.{e}.w1.weight). What SaveFull writes and a checkpoint of full
  // fine-tuning restores.
  std::vector<std::pair<std::string, at::Tensor>> StoredWeights() const;

  // The final-norm hidden states of the chunk, [C, hidden].
  at::Tensor Hidden(const ChunkInput& input, const AttentionFn& attention) const;

  // The same forward one layer at a time, for schedules that interleave chunks (stage 1 of
  // ChunkTrainer runs two chunks a layer apart, so one chunk's page fetch overlaps the other's
  // compute). Hidden is exactly: cursor = Begin(input); per layer, [q, k, v] =
  // AttentionInputs(cursor), FinishLayer(cursor, attention(cursor.layer, q, k, v)); End(cursor).
  // The operations, and the draws of LoRA dropout, are the same in the same order, so a chunk
  // computed either way gives the same values.
  struct Cursor {
    int64_t layer = 0;  // the next layer to run
    at::Tensor h;       // the residual stream [C, hidden]
    at::Tensor cos, sin;
    at::Tensor sliding_cos, sliding_sin;  // ModelConfig::sliding_rope's, when it has one
    at::Generator gen;
    bool training = false;
    RouterBalance* balance = nullptr;  // ChunkInput's
  };
  Cursor Begin(const ChunkInput& input) const;
  // q [C, heads, D], k and v [C, kv_heads, D] of layer cursor.layer, q and k after RoPE.
  std::array<at::Tensor, 3> AttentionInputs(Cursor& cursor) const;
  // Layer cursor.layer's output projection and MLP over the attention's output [C, heads, D];
  // advances the cursor.
  void FinishLayer(Cursor& cursor, const at::Tensor& attention) const;
  // The final-norm hidden states, once every layer ran.
  at::Tensor End(const Cursor& cursor) const;
  // The LM head weight [vocab, hidden] (the embedding when tied; this rank's rows under tensor
  // parallelism).
  const at::Tensor& lm_head() const { return config_.tie_word_embeddings ? embed_ : lm_head_; }
  // Layer `layer`'s attention sinks [num_heads] (gpt-oss), undefined where it has none.
  const at::Tensor& sinks(int64_t layer) const { return layers_[layer].attention.sinks; }

 private:
  Transformer(ModelConfig config, at::ScalarType dtype, at::Device device);
  // What the blocks' forwards read of the model.
  BlockContext Context() const { return {config_, spec_, dtype_, tp_}; }
  // The weights of the layers with their HF names and descriptions, in the checkpoint's order:
  // layer i's norms; every layer's linear layers.
  struct NamedNorm {
    std::string name;
    const NormSpec* spec;
    at::Tensor* weight;
  };
  struct NamedLinear {
    std::string name;
    const LinearSpec* spec;
    Linear* linear;
  };
  std::vector<NamedNorm> NamedNorms(int64_t i);
  std::vector<NamedLinear> NamedLinears();
  std::vector<std::pair<std::string, const Linear*>> NamedLinears() const;
  // The expert banks of the sparse layers, with their HF names (mlp.experts.gate_up_proj).
  struct NamedBank {
    std::string name;
    int64_t layer;
    ExpertBankSpec spec;
    ExpertBank* bank;
  };
  std::vector<NamedBank> NamedBanks();
  // The router's and the experts' weights of sparse layer i under their checkpoint names, as
  // views of its tensors (which must exist).
  std::vector<std::pair<std::string, at::Tensor>> StoredMoe(int64_t i) const;
  // The router's and the expert banks' biases of sparse layer i (MoeSpec::biases) under their
  // names, in the checkpoint's order (none without).
  std::vector<std::pair<std::string, at::Tensor>> MoeBiases(int64_t i) const;
  // Sparse layer i's router and expert banks (and their biases), uninitialised.
  void AllocateMoe(int64_t i, const at::TensorOptions& options);
  // The router's name in sparse layer i: model.layers.{i}.mlp.gate (gpt-oss: mlp.router).
  std::string RouterName(int64_t i) const;
  // Every tensor of the model (weights, biases, norms, sinks, routers, adapters; undefined ones
  // too) with how tensor parallelism splits it (tensor_parallel.h): the one place that says so.
  using Slot = TensorSlot;
  std::vector<Slot> Slots();
  // The split of the tensor `slot` points at (one of Slots()'s).
  Split SlotSplit(const at::Tensor* slot);
  // Joins `group` (CheckTensorParallel holding) before any tensor is split: what the forward
  // needs to know of the rank's place.
  void JoinGroup(const kernels::Collectives& group);
  // This rank's share of the whole tensor in `slot` (itself without tensor parallelism).
  at::Tensor ShardOf(const at::Tensor* slot, const at::Tensor& whole);

  ModelConfig config_;
  ModelSpec spec_;
  at::ScalarType dtype_;
  at::Device device_;
  at::Tensor embed_;       // [vocab, hidden]
  at::Tensor final_norm_;  // [hidden]
  at::Tensor lm_head_;     // [vocab, hidden]; undefined when tied
  std::vector<DecoderLayer> layers_;
  std::optional<LoraOptions> lora_;
  bool full_ = false;
  ExpertKernel expert_kernel_ = ExpertKernel::kAuto;
  int64_t expert_recompute_layers_ = 0;
  const kernels::Collectives* tp_ = nullptr;  // Shard's group
  int64_t vocab_begin_ = 0;                   // this rank's first row of the vocabulary
};

}  // namespace oomb

#endif  // OOMB_WORKER_MODEL_TRANSFORMER_H_
