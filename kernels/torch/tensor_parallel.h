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

#include <functional>
#include <memory>
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

  // A collective started and not yet waited for.
  class Pending {
   public:
    virtual ~Pending() = default;
    // Makes what the caller runs next wait for it: on a GPU the caller's current stream (the
    // thread goes on), on the CPU the thread.
    virtual void Wait() = 0;
  };
  // Starts the element-wise sum of `t` over the ranks, in place: `t` must not be read or written
  // until Wait() returned. Sums started by one thread complete in the order they were started.
  virtual std::unique_ptr<Pending> StartSum(at::Tensor& t) const = 0;
};

// f: the identity; backward sums the incoming gradient over the ranks (a replicated activation
// entering a column-parallel region, whose gradient each rank has only its features' share of).
at::Tensor EnterShards(const at::Tensor& x, const Collectives& group);
// g: the sum over the ranks; backward is the identity (a row-parallel product's partial sums).
at::Tensor SumShards(const at::Tensor& x, const Collectives& group);

// fn over blocks of rows of a replicated x [rows, ...]: with `enter`, each block enters fn as
// through EnterShards, and with `sum` each of fn's outputs leaves it as through SumShards; the
// outputs' blocks are concatenated again. The values are EnterShards / SumShards around fn on
// the whole x (fn must treat rows independently; it is called once per block, in order), but
// the sums of a block run while the next block computes: forward, each block's partial outputs
// are summed while the next block's fn runs; backward, each block's input gradient is summed
// while the previous block's backward runs. The sums still exposed are the last block's (the
// GPU's time waiting for them is --sections' "tensor_parallel.sum"). blocks 1 is the plain
// EnterShards / SumShards.
std::vector<at::Tensor> OverlapShards(const at::Tensor& x, const Collectives& group, int64_t blocks, bool enter,
                                      bool sum, const std::function<std::vector<at::Tensor>(const at::Tensor&)>& fn);

// A rank's rows [begin, begin + rows of its LM head) of a vocabulary of `vocab` tokens, for the
// vocabulary-parallel LM head and cross-entropy (kernels/torch/chunked_cross_entropy.h).
struct VocabShard {
  const Collectives* group = nullptr;
  int64_t begin = 0;
  int64_t vocab = 0;
};

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_TORCH_TENSOR_PARALLEL_H_
