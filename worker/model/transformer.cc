#include "worker/model/transformer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#if defined(OOMB_HAVE_CUDA)
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/torch/chunked_cross_entropy.h"
#include "kernels/torch/expert_ops.h"
#include "kernels/torch/layer_ops.h"
#include "kernels/torch/matmul.h"
#include "kernels/torch/upload.h"
#include "worker/common/status.h"
#include "worker/hf/json_reader.h"
#include "worker/hf/safetensors.h"
#include "worker/model/rope.h"

namespace oomb {

Transformer::Transformer(ModelConfig config, at::ScalarType dtype, at::Device device)
    : config_(std::move(config)),
      spec_(DescribeModel(config_)),
      dtype_(dtype),
      device_(device),
      layers_(config_.num_layers) {
  for (int64_t i = 0; i < config_.num_layers; ++i) layers_[i].Describe(spec_.layers[i]);
}

std::vector<Transformer::NamedLinear> Transformer::NamedLinears() {
  std::vector<NamedLinear> out;
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    for (const LinearSpec& l : spec_.layers[i].linears) {
      out.push_back({absl::StrCat("model.layers.", i, l.attention ? ".self_attn." : ".mlp.", l.name), &l,
                     layers_[i].LinearNamed(l.name)});
    }
  }
  return out;
}

std::vector<std::pair<std::string, const Linear*>> Transformer::NamedLinears() const {
  std::vector<std::pair<std::string, const Linear*>> out;
  for (const NamedLinear& l : const_cast<Transformer*>(this)->NamedLinears()) out.emplace_back(l.name, l.linear);
  return out;
}

std::vector<Transformer::NamedNorm> Transformer::NamedNorms(int64_t i) {
  std::vector<NamedNorm> out;
  for (const NormSpec& n : spec_.layers[i].norms) {
    out.push_back({absl::StrCat("model.layers.", i, ".", n.name), &n, layers_[i].Norm(n.role)});
  }
  return out;
}

std::vector<Transformer::NamedBank> Transformer::NamedBanks() {
  std::vector<NamedBank> out;
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    const std::optional<MoeSpec>& moe = spec_.layers[i].moe;
    if (!moe.has_value()) continue;
    for (const ExpertBankSpec& b : moe->Banks()) {
      out.push_back({absl::StrCat("model.layers.", i, ".mlp.experts.", b.name), i, b, layers_[i].Bank(b.name)});
    }
  }
  return out;
}

std::vector<Transformer::Slot> Transformer::Slots() {
  std::vector<Slot> out;
  const Split vocab = Split::Vocabulary(config_.vocab_size);
  out.push_back({&embed_, vocab});
  out.push_back({&lm_head_, vocab});
  out.push_back({&final_norm_, Split::Replicated()});
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    for (const NamedNorm& n : NamedNorms(i)) {  // a per-head norm sees the rank's heads alone
      const bool per_head = n.spec->role == NormRole::kQuery || n.spec->role == NormRole::kKey;
      out.push_back({n.weight, per_head ? Split::Partial() : Split::Replicated()});
    }
    out.push_back({&layers_[i].attention.sinks, Split::Along(0, {config_.num_heads})});
    out.push_back({&layers_[i].experts.router, Split::Partial()});
    out.push_back({&layers_[i].experts.router_bias, Split::Partial()});
  }
  // Each linear layer's and bank's own (Linear::AddSlots, ExpertBank::AddSlots).
  for (const NamedLinear& l : NamedLinears()) l.linear->AddSlots(&out);
  for (const NamedBank& b : NamedBanks()) b.bank->AddSlots(&out);
  return out;
}

Split Transformer::SlotSplit(const at::Tensor* slot) {
  for (const Slot& s : Slots()) {
    if (s.tensor == slot) return s.split;
  }
  TORCH_CHECK(false, "not a tensor of the model");
}

void Transformer::JoinGroup(const kernels::Collectives& group) {
  const int rank = group.rank(), n = group.size();
  for (const NamedLinear& l : NamedLinears()) l.linear->JoinGroup(l.spec->in, rank, n);
  vocab_begin_ = ShardRanges(Split::Vocabulary(config_.vocab_size), rank, n)[0].first;
  tp_ = &group;
}

at::Tensor Transformer::ShardOf(const at::Tensor* slot, const at::Tensor& whole) {
  if (tp_ == nullptr) return whole;
  at::NoGradGuard no_grad;
  return TakeShard(whole, SlotSplit(slot), tp_->rank(), tp_->size());
}

absl::Status Transformer::Shard(const kernels::Collectives& group) {
  if (tp_ != nullptr) return absl::FailedPreconditionError("the model is already sharded");
  OOMB_RETURN_IF_ERROR(CheckTensorParallel(config_, group.size()));
  JoinGroup(group);
  for (const Slot& slot : Slots()) *slot.tensor = ShardOf(slot.tensor, *slot.tensor);
  return absl::OkStatus();
}

Split Transformer::SplitOf(const at::Tensor& tensor) const {
  for (const Slot& slot : const_cast<Transformer*>(this)->Slots()) {
    if (slot.tensor->defined() && slot.tensor->is_same(tensor)) return slot.split;
  }
  return Split::Replicated();
}

std::vector<at::Tensor> Transformer::PartialGradients() const {
  std::vector<at::Tensor> out;
  if (tp_ == nullptr) return out;
  for (const Slot& slot : const_cast<Transformer*>(this)->Slots()) {
    const at::Tensor& t = *slot.tensor;
    if (slot.split.kind == Split::Kind::kPartial && t.defined() && t.requires_grad()) out.push_back(t);
  }
  return out;
}

std::unique_ptr<Transformer> Transformer::Whole(bool trainable_only) const {
  std::unique_ptr<Transformer> m(new Transformer(config_, dtype_, device_));
  const std::vector<Slot> from = const_cast<Transformer*>(this)->Slots(), to = m->Slots();
  for (size_t i = 0; i < from.size(); ++i) {
    const at::Tensor& t = *from[i].tensor;
    if (!t.defined() || (trainable_only && !t.requires_grad())) continue;
    at::Tensor whole = tp_ != nullptr ? GatherWhole(t, from[i].split, *tp_) : t.detach().clone();
    if (whole.data_ptr() == t.data_ptr()) whole = whole.detach().clone();
    whole.set_requires_grad(t.requires_grad());
    if (t.grad().defined()) {
      whole.mutable_grad() = tp_ != nullptr ? GatherWhole(t.grad(), from[i].split, *tp_) : t.grad().clone();
    }
    *to[i].tensor = whole;
  }
  const std::vector<NamedLinear> src = const_cast<Transformer*>(this)->NamedLinears(), dst = m->NamedLinears();
  for (size_t i = 0; i < src.size(); ++i) {
    dst[i].linear->lora_scaling = src[i].linear->lora_scaling;
    dst[i].linear->lora_dropout = src[i].linear->lora_dropout;
  }
  const std::vector<NamedBank> src_banks = const_cast<Transformer*>(this)->NamedBanks(), dst_banks = m->NamedBanks();
  for (size_t i = 0; i < src_banks.size(); ++i) dst_banks[i].bank->lora_scaling = src_banks[i].bank->lora_scaling;
  m->lora_ = lora_;
  m->full_ = full_;
  m->expert_kernel_ = expert_kernel_;
  m->expert_recompute_layers_ = expert_recompute_layers_;
  return m;
}

at::Tensor Transformer::LmHeadLoss(const at::Tensor& hidden, const at::Tensor& labels, int64_t rows_per_block) const {
  if (tp_ == nullptr) return kernels::ChunkedLmHeadCrossEntropy(hidden, lm_head(), labels, rows_per_block);
  const kernels::VocabShard shard{tp_, vocab_begin_, config_.vocab_size};
  return kernels::ChunkedLmHeadCrossEntropy(hidden, lm_head(), labels, rows_per_block, &shard);
}

std::pair<at::Tensor, at::Tensor> Transformer::LmHeadScores(const at::Tensor& hidden, const at::Tensor& labels,
                                                            int64_t rows_per_block) const {
  if (tp_ == nullptr) return kernels::LmHeadTokenScores(hidden, lm_head(), labels, rows_per_block);
  const kernels::VocabShard shard{tp_, vocab_begin_, config_.vocab_size};
  return kernels::LmHeadTokenScores(hidden, lm_head(), labels, rows_per_block, &shard);
}

Transformer::Cursor Transformer::Begin(const ChunkInput& input) const {
  Cursor cursor;
  // LoRA dropout's masks are drawn where the activations are: a generator of that device, seeded
  // for the chunk (a CUDA generator's masks are the same on every device for one seed).
#if defined(OOMB_HAVE_CUDA)
  if (device_.is_cuda()) {
    cursor.gen = at::cuda::detail::createCUDAGenerator(device_.index());
    cursor.gen.set_current_seed(input.dropout_seed);
  } else {
    cursor.gen = at::detail::createCPUGenerator(input.dropout_seed);
  }
#else
  cursor.gen = at::detail::createCPUGenerator(input.dropout_seed);
#endif
  auto [cos, sin] = oomb::RopeTables(config_, config_.rope, input.positions, input.rope_seq_len, dtype_);
  cursor.cos = cos.unsqueeze(1);  // [C, 1, D]
  cursor.sin = sin.unsqueeze(1);
  if (spec_.HasLocalRope()) {
    auto [local_cos, local_sin] =
        oomb::RopeTables(config_, *config_.sliding_rope, input.positions, input.rope_seq_len, dtype_);
    cursor.sliding_cos = local_cos.unsqueeze(1);
    cursor.sliding_sin = local_sin.unsqueeze(1);
  }
  if (tp_ == nullptr) {
    cursor.h = at::embedding(embed_, input.ids);
  } else {  // the rank's rows of the vocabulary, the others' tokens zeros, summed over the group
    const int64_t rows = embed_.size(0);
    const at::Tensor local = input.ids - vocab_begin_;
    const at::Tensor own = local.ge(0) & local.lt(rows);
    cursor.h = Context().SumShards(at::embedding(embed_, local.clamp(0, rows - 1)) * own.unsqueeze(1).to(dtype_));
  }
  if (spec_.scale_embeddings) {  // times sqrt(hidden) rounded to the model's dtype, as transformers does
    cursor.h = cursor.h * at::scalar_tensor(std::sqrt(static_cast<double>(config_.hidden_size)), dtype_).item();
  }
  cursor.training = input.training;
  cursor.balance = input.balance;
  return cursor;
}

std::array<at::Tensor, 3> Transformer::AttentionInputs(Cursor& cursor) const {
  const BlockContext ctx = Context();
  const DecoderLayer& l = layers_[cursor.layer];
  const LayerSpec& spec = spec_.layers[cursor.layer];
  const at::Tensor x = ctx.EnterShards(ctx.Norm(cursor.h, l.input_norm));
  const bool local = spec.local_rope;
  return l.attention.Inputs(ctx, spec, x, local ? cursor.sliding_cos : cursor.cos,
                            local ? cursor.sliding_sin : cursor.sin, &cursor.gen, cursor.training);
}

void Transformer::FinishLayer(Cursor& cursor, const at::Tensor& attention) const {
  const BlockContext ctx = Context();
  const DecoderLayer& l = layers_[cursor.layer];
  const LayerSpec& spec = spec_.layers[cursor.layer];
  at::Tensor attn_out = l.attention.Output(ctx, attention, &cursor.gen, cursor.training);
  if (spec.Has(NormRole::kAttentionOutput)) attn_out = ctx.Norm(attn_out, l.attn_out_norm);
  const at::Tensor h = cursor.h + attn_out;
  // The MLP block the layer's description names: dense, or of experts.
  const at::Tensor y = ctx.EnterShards(ctx.Norm(h, l.post_norm));
  at::Tensor mlp_out;
  if (spec.moe.has_value()) {
    const auto sparse_before = std::count_if(spec_.layers.begin(), spec_.layers.begin() + cursor.layer,
                                             [](const LayerSpec& s) { return s.moe.has_value(); });
    const ExpertRun run{.kernel = expert_kernel(),
                        .recompute_gate_up = sparse_before < expert_recompute_layers_,
                        .balance = cursor.balance};
    mlp_out = ctx.SumShards(l.experts.Forward(ctx, *spec.moe, run, y));
  } else {
    mlp_out = l.mlp.Forward(ctx, spec, y, &cursor.gen, cursor.training);
  }
  if (spec.Has(NormRole::kMlpOutput)) mlp_out = ctx.Norm(mlp_out, l.mlp_out_norm);
  cursor.h = h + mlp_out;
  ++cursor.layer;
}

ExpertKernel Transformer::expert_kernel() const {
  std::vector<int64_t> ranks;  // the adapted banks' LoRA ranks
  for (const DecoderLayer& l : layers_) {
    for (const ExpertBank* b : {&l.experts.gate_up, &l.experts.down}) {
      if (b->lora_a.defined()) ranks.push_back(b->lora_a.size(0) / b->weight.size(0));
    }
  }
  return ChooseExpertKernel(expert_kernel_, config_, dtype_, device_, tensor_parallel_size(), ranks);
}

at::Tensor Transformer::End(const Cursor& cursor) const { return Context().Norm(cursor.h, final_norm_); }

at::Tensor Transformer::Hidden(const ChunkInput& input, const AttentionFn& attention) const {
  Cursor cursor = Begin(input);
  while (cursor.layer < config_.num_layers) {
    const auto [q, k, v] = AttentionInputs(cursor);
    FinishLayer(cursor, attention(cursor.layer, q, k, v));
  }
  return End(cursor);
}

}  // namespace oomb
