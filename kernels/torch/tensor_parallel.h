// Tensor parallelism's collectives inside the autograd graph (Megatron-LM's f and g operators).
//
// A tensor-parallel group of N ranks holds 1/N of each layer's heads and of its MLP's
// intermediate features, and 1/N of the vocabulary (which part of which weight:
// worker/model/tensor_parallel.h). The residual stream is replicated: every rank holds the same
// [C, hidden] values and the same gradient of them. A column-parallel product (q, k, v, gate,
// up) takes it through EnterShards and gives the rank's own features; a row-parallel product
// (o, down) gives a partial sum, which SumShards adds up over the ranks. Both are exact up to the
// order of the additions.
//
// Thread-safety: a Collectives is used by the one thread of its rank (and, inside backward, by
// the autograd engine working for that thread); every rank makes the same calls in the same
// order, each blocking until every rank joined it.
#ifndef OOMB_KERNELS_TORCH_TENSOR_PARALLEL_H_
#define OOMB_KERNELS_TORCH_TENSOR_PARALLEL_H_

#include <ATen/core/Tensor.h>

#include <vector>

namespace oomb::kernels {

enum class ReduceOp { kSum, kMax, kMin };

// The collectives of a group of ranks (implemented over c10d: worker/train/rank_group.h).
// Failures throw (c10::Error), as LibTorch's operators do.
class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Element-wise over the ranks, in place; every rank passes a tensor of the same shape and dtype.
  virtual void AllReduce(at::Tensor& t, ReduceOp op) const = 0;
  // Every rank's `t` (same shape on every rank), in rank order.
  virtual std::vector<at::Tensor> AllGather(const at::Tensor& t) const = 0;
};

// f: the identity; backward sums the incoming gradient over the ranks (a replicated activation
// entering a column-parallel region, whose gradient each rank has only its features' share of).
at::Tensor EnterShards(const at::Tensor& x, const Collectives& group);
// g: the sum over the ranks; backward is the identity (a row-parallel product's partial sums).
at::Tensor SumShards(const at::Tensor& x, const Collectives& group);

// A rank's rows [begin, begin + rows of its LM head) of a vocabulary of `vocab` tokens, for the
// vocabulary-parallel LM head and cross-entropy (kernels/torch/chunked_cross_entropy.h).
struct VocabShard {
  const Collectives* group = nullptr;
  int64_t begin = 0;
  int64_t vocab = 0;
};

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_TORCH_TENSOR_PARALLEL_H_
