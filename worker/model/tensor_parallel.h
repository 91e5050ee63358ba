// Tensor parallelism within a node (Megatron-LM's layout): which part of each weight a rank of a
// tensor-parallel group keeps, and how the parts make the whole again.
//
// The layout, N ranks, rank r (the split of each layer is its LinearSpec's / ExpertBankSpec's,
// worker/hf/layer_spec.h):
// - Attention: q, k and v are column-parallel: rank r keeps query heads [r H/N, (r+1) H/N) and
//   KV heads [r Hkv/N, (r+1) Hkv/N), so each query head stays with its KV head, the rank's
//   attention is over its heads alone and its KV and KV-gradient pages hold only theirs
//   (Phi-3's qkv_proj is split part by part). o_proj is row-parallel (its input columns of those
//   heads); the sinks are split like the heads.
// - MLP: gate and up (gate_up_proj part by part) are column-parallel over the intermediate
//   features, down row-parallel. An expert bank is split the same way, every expert alike:
//   gate_up_proj over its intermediate rows (gpt-oss's interleaved gate/up pairs stay together),
//   down_proj over its input columns. Experts are not spread over the ranks (no expert
//   parallelism): each rank computes every routed expert on its share of its features, and
//   the routing (the router replicated) is the same on every rank.
// - Embedding and LM head: vocabulary-parallel, rank r keeping rows [r ceil(V/N), ...) (the last
//   rank fewer when N does not divide V); the lookup sums the ranks' rows, the loss is
//   kernels::ChunkedLmHeadCrossEntropy's vocabulary-parallel form.
// - Norms (the q/k norms included) and the router: replicated.
// - LoRA follows its layer: on a column-parallel layer A is replicated and B split like the
//   weight's rows; on a row-parallel layer A is split like the weight's columns and B
//   replicated. An expert bank's adapter likewise.
//
// Gradients: a replicated tensor whose gradient each rank computes from its own share of the
// layer — a row-parallel layer's replicated LoRA B and a column-parallel layer's A, the q/k norms
// (of the rank's heads), a row-parallel layer's bias (added by rank 0 alone, before the sum), the
// router (weighing the experts' partial outputs) — holds a partial gradient (Split::kPartial),
// summed over the group after the backward (Transformer::PartialGradients). Every other
// replicated tensor's gradient is the same on every rank.
#ifndef OOMB_WORKER_MODEL_TENSOR_PARALLEL_H_
#define OOMB_WORKER_MODEL_TENSOR_PARALLEL_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/torch/tensor_parallel.h"

namespace oomb {

struct Split {
  enum class Kind {
    kReplicated,  // the whole tensor on every rank, the same gradient on every rank
    kPartial,     // the whole tensor on every rank, each with a share of its gradient
    kSharded,     // each rank its piece of every part of dimension `dim`
  };
  Kind kind = Kind::kReplicated;
  int64_t dim = 0;
  std::vector<int64_t> parts;  // kSharded: the parts' sizes along dim, each split evenly
  bool uneven = false;         // one part split in pieces of ceil(size / N), the last smaller

  static Split Replicated() { return {}; }
  static Split Partial() { return {Kind::kPartial, 0, {}, false}; }
  static Split Along(int64_t dim, std::vector<int64_t> parts) { return {Kind::kSharded, dim, std::move(parts)}; }
  // The vocabulary's rows (embedding, LM head) of a vocabulary of `vocab` tokens.
  static Split Vocabulary(int64_t vocab) { return {Kind::kSharded, 0, {vocab}, true}; }
};

// The ranges [begin, end) of dimension s.dim that rank `rank` of `size` keeps, one per part.
std::vector<std::pair<int64_t, int64_t>> ShardRanges(const Split& s, int rank, int size);
// Whether N = size splits every part of `s` evenly (always for an uneven split).
bool Divides(const Split& s, int size);

// Rank `rank`'s piece of the whole tensor (a contiguous copy; the tensor itself when not
// kSharded).
at::Tensor TakeShard(const at::Tensor& whole, const Split& s, int rank, int size);
// The whole tensor on every rank from each rank's piece (`shard`; TakeShard's inverse);
// `shard` itself when not kSharded.
at::Tensor GatherWhole(const at::Tensor& shard, const Split& s, const kernels::Collectives& group);

}  // namespace oomb

#endif  // OOMB_WORKER_MODEL_TENSOR_PARALLEL_H_
