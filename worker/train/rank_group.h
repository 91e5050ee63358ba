// A group of ranks over LibTorch's c10d (ProcessGroupNCCL between CUDA devices,
// ProcessGroupGloo on the CPU), and what data and tensor parallelism do over it.
//
// Tensor parallelism: the group is the model's kernels::Collectives (Transformer::Shard; the
// layout and its gradients in worker/model/tensor_parallel.h); after a step's backward the
// ranks sum the partial gradients (Transformer::PartialGradients) with AllReduceGradients.
//
// Data parallelism (resources.gpus: k, or k / parallel.tensor groups of ranks): k ranks, each a
// full replica of the model (or a tensor-parallel group, one), train disjoint sequences of the
// same global batch; gradients are summed over the ranks with LibTorch's c10d collectives
// (ProcessGroupNCCL between CUDA devices, ProcessGroupGloo on the CPU), so every rank takes the
// optimizer step one device would take with the same global batch.
//
// Exactness: every rank scales its sequences' losses by 1 / (label tokens of the whole global
// batch), so the sum of the ranks' gradients is the single-device gradient; only the order of
// the floating-point additions differs (float32: within 1e-6 relative, tested).
//
// Which rank trains what: sequence i of a global batch belongs to rank i mod k (Owns), and the
// dropout seed of sequence i is the same as on one device.
//
// Overlap: the gradient of a parameter is final only after the backward of chunk 0 of the
// rank's last sequence (every chunk adds into it), so the all-reduce runs after the backward,
// bucketed (one flat all-reduce per ~bucket_bytes of gradients of one dtype, all buckets in
// flight at once). bench/ measures what it costs.
//
// Failure: collectives block until every rank joins them, so ranks never leave a step
// silently: a rank that failed or was asked to stop says so in the step's SumAcrossRanks, and
// every rank then stops at the same point (executor.cc). A rank that dies without that (the
// process crashed) takes its peers with it; collectives time out after `timeout`.
//
// Thread-safety: a group is used by the one thread of its rank (and, inside a backward on a
// GPU, by the autograd engine's thread working for it; never both at once). Ranks of one process on CUDA
// devices need LibTorch's flight recorder off (DisableFlightRecorder) before any thread
// starts: see rank_group.cc.
#ifndef OOMB_WORKER_TRAIN_RANK_GROUP_H_
#define OOMB_WORKER_TRAIN_RANK_GROUP_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/torch/tensor_parallel.h"

namespace oomb {

// Where the ranks of one group meet (c10d's key-value store).
class Rendezvous {
 public:
  // For the k threads of one process (an in-memory store shared by them).
  static Rendezvous InProcess();
  // For k processes of one host: a file they all open (c10d FileStore); the file must not
  // exist yet or be left over from a finished group.
  static Rendezvous File(const std::string& path, int world_size);
  // For a subgroup of the ranks that met here: the same store, its keys under `prefix` (c10d
  // PrefixStore), one prefix per subgroup.
  Rendezvous Prefixed(const std::string& prefix) const;

  struct Store;  // c10d::Store, hidden from this header
  std::shared_ptr<Store> store;
};

// Sets TORCH_FR_BUFFER_SIZE=0 unless the environment already sets it. Call from main() before
// any other thread exists (it changes the environment).
void DisableFlightRecorder();

class RankGroup : public kernels::Collectives {
 public:
  // Joins the group as `rank` of `world_size` on `device` (all CUDA or all CPU across ranks).
  // Blocks until every rank joined. INVALID_ARGUMENT for a bad rank or device mix;
  // UNAVAILABLE when c10d fails to connect (the message carries its error).
  static absl::StatusOr<std::unique_ptr<RankGroup>> Join(const Rendezvous& rendezvous, int rank, int world_size,
                                                         at::Device device, absl::Duration timeout = absl::Hours(2));
  ~RankGroup() override;
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return world_size_; }
  // kernels::Collectives: failures throw c10::Error with the group's rank in the message.
  void AllReduce(at::Tensor& t, kernels::ReduceOp op) const override;
  std::vector<at::Tensor> AllGather(const at::Tensor& t) const override;
  // Whether sequence `index` of a global batch is this rank's.
  bool Owns(int64_t index) const { return index % world_size_ == rank_; }

  // Sums the gradients of `params` over the ranks, in place. A parameter without a gradient
  // counts as zeros and gets one. Every rank passes the same parameters in the same order.
  absl::Status AllReduceGradients(const std::vector<at::Tensor>& params, int64_t bucket_bytes = 25 << 20);

  // Element-wise sums of a few host values over the ranks (in float64): losses, token counts,
  // stop and failure flags. Every rank passes the same number of values.
  absl::StatusOr<std::vector<double>> SumAcrossRanks(const std::vector<double>& values);

  struct Impl;

 private:
  RankGroup(int rank, int world_size, std::unique_ptr<Impl> impl);
  const int rank_;
  const int world_size_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace oomb

#endif  // OOMB_WORKER_TRAIN_RANK_GROUP_H_
