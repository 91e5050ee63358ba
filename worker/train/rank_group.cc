#include "worker/train/rank_group.h"

// The PyPI wheel's libtorch_cpu and libtorch_cuda export both process groups; the Gloo and
// NCCL headers they need come from worker/CMakeLists.txt (OOMB_HAVE_NCCL: NCCL's were found).
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef OOMB_HAVE_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"

namespace oomb {
namespace {

// LibTorch 2.11's c10d FlightRecorder (a process-wide singleton every process group records its
// collectives in) inserts a new group's status into a std::map before taking its own lock, so
// two groups of one process starting collectives at the same time can corrupt that map (seen:
// a crash in std::_Rb_tree_insert_and_rebalance under recordWithResetEnabled, with two Gloo
// ranks as threads). Gloo collectives therefore start under this lock (starting one only
// queues it). NCCL collectives must not: the first one on a communicator connects to the
// peers inside the call (NCCL's runtime connect), so a rank holding the lock would wait for a
// peer that waits for the lock (seen on 2 H200s). For NCCL the recorder is off instead:
// oombd's main() sets TORCH_FR_BUFFER_SIZE=0 before any thread starts (DisableFlightRecorder).
std::mutex& EnqueueMutex() {
  static std::mutex mu;
  return mu;
}

c10::intrusive_ptr<c10d::Work> StartAllReduce(c10d::Backend& backend, bool serialise, std::vector<at::Tensor>& tensors,
                                              c10d::ReduceOp op = c10d::ReduceOp::SUM) {
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  if (!serialise) return backend.allreduce(tensors, options);
  std::lock_guard<std::mutex> lock(EnqueueMutex());
  return backend.allreduce(tensors, options);
}

c10::intrusive_ptr<c10d::Work> StartAllGather(c10d::Backend& backend, bool serialise,
                                              std::vector<std::vector<at::Tensor>>& outputs,
                                              std::vector<at::Tensor>& inputs) {
  if (!serialise) return backend.allgather(outputs, inputs);
  std::lock_guard<std::mutex> lock(EnqueueMutex());
  return backend.allgather(outputs, inputs);
}

}  // namespace

void DisableFlightRecorder() { ::setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0); }

struct Rendezvous::Store {
  c10::intrusive_ptr<c10d::Store> store;
};

Rendezvous Rendezvous::InProcess() {
  return Rendezvous{std::make_shared<Store>(Store{c10::make_intrusive<c10d::HashStore>()})};
}

Rendezvous Rendezvous::File(const std::string& path, int world_size) {
  return Rendezvous{std::make_shared<Store>(Store{c10::make_intrusive<c10d::FileStore>(path, world_size)})};
}

Rendezvous Rendezvous::Prefixed(const std::string& prefix) const {
  return Rendezvous{std::make_shared<Store>(Store{c10::make_intrusive<c10d::PrefixStore>(prefix, store->store)})};
}

struct RankGroup::Impl {
  at::Device device = at::kCPU;
  c10::intrusive_ptr<c10d::Backend> backend;
};

RankGroup::RankGroup(int rank, int world_size, std::unique_ptr<Impl> impl)
    : rank_(rank), world_size_(world_size), impl_(std::move(impl)) {}

RankGroup::~RankGroup() = default;

// OOMB_DP_TRACE=1: each rank prints where it is (joining, connected, each collective) to
// stderr, for diagnosing a group that does not make progress.
static void Trace(int rank, const std::string& what) {
  static const bool on = [] {
    const char* v = std::getenv("OOMB_DP_TRACE");
    return v != nullptr && std::string(v) == "1";
  }();
  if (on) std::fprintf(stderr, "[dp rank %d] %s\n", rank, what.c_str());
}

absl::StatusOr<std::unique_ptr<RankGroup>> RankGroup::Join(const Rendezvous& rendezvous, int rank, int world_size,
                                                           at::Device device, absl::Duration timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("data parallel: rank ", rank, " of ", world_size));
  }
  if (rendezvous.store == nullptr) return absl::InvalidArgumentError("data parallel: no rendezvous");
  const auto timeout_ms = std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
  rendezvous.store->store->setTimeout(timeout_ms);
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  try {
    if (device.is_cuda()) {
#ifdef OOMB_HAVE_NCCL
      c10::cuda::set_device(device.index());
      Trace(rank, "creating the NCCL process group on " + device.str());
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = timeout_ms;
      impl->backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(rendezvous.store->store, rank, world_size, options);
      // The communicator now, every rank joining at once, rather than inside the first
      // collective.
      impl->backend->eagerConnectSingleDevice(device);
      Trace(rank, "NCCL communicator connected");
#else
      return absl::UnimplementedError("data parallel on CUDA devices: this build has no NCCL");
#endif
    } else if (device.is_cpu()) {
      auto options = c10d::ProcessGroupGloo::Options::create(timeout_ms);
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      impl->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(rendezvous.store->store, rank, world_size, options);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("data parallel: unsupported device ", device.str()));
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("data parallel: joining as rank ", rank, " of ", world_size, " on ",
                                               device.str(), ": ", e.what()));
  }
  return std::unique_ptr<RankGroup>(new RankGroup(rank, world_size, std::move(impl)));
}

absl::Status RankGroup::AllReduceGradients(const std::vector<at::Tensor>& params, int64_t bucket_bytes) {
  if (world_size_ == 1) return absl::OkStatus();
  try {
    // Buckets of one dtype each, in the parameters' order: every rank builds the same ones.
    struct Bucket {
      std::vector<at::Tensor> grads;
      int64_t bytes = 0;
      at::Tensor flat;
      c10::intrusive_ptr<c10d::Work> work;
    };
    std::vector<Bucket> buckets;
    std::map<at::ScalarType, size_t> open;  // dtype -> index of its bucket being filled
    for (const at::Tensor& p : params) {
      at::Tensor& g = p.mutable_grad();
      if (!g.defined()) g = at::zeros_like(p);
      const auto it = open.find(g.scalar_type());
      if (it == open.end() || buckets[it->second].bytes >= bucket_bytes) {
        open[g.scalar_type()] = buckets.size();
        buckets.emplace_back();
      }
      Bucket& b = buckets[open[g.scalar_type()]];
      b.grads.push_back(g);
      b.bytes += g.numel() * g.element_size();
    }
    for (Bucket& b : buckets) {
      std::vector<at::Tensor> flat_parts;
      for (const at::Tensor& g : b.grads) flat_parts.push_back(g.reshape({-1}));
      b.flat = at::cat(flat_parts);
      std::vector<at::Tensor> tensors{b.flat};
      b.work = StartAllReduce(*impl_->backend, impl_->device.is_cpu(), tensors);
    }
    Trace(rank_, absl::StrCat("gradients: ", buckets.size(), " buckets started"));
    for (Bucket& b : buckets) {
      b.work->wait();
      int64_t offset = 0;
      for (at::Tensor& g : b.grads) {
        g.copy_(b.flat.narrow(0, offset, g.numel()).view_as(g));
        offset += g.numel();
      }
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("data parallel: all-reduce of the gradients: ", e.what()));
  }
  return absl::OkStatus();
}

void RankGroup::AllReduce(at::Tensor& t, kernels::ReduceOp op) const {
  const c10d::ReduceOp reduce = op == kernels::ReduceOp::kSum   ? c10d::ReduceOp::SUM
                                : op == kernels::ReduceOp::kMax ? c10d::ReduceOp::MAX
                                                                : c10d::ReduceOp::MIN;
  TORCH_CHECK(t.is_contiguous(), "rank group: all-reduce of a non-contiguous tensor");
  std::vector<at::Tensor> tensors{t};
  Trace(rank_, absl::StrCat("all-reduce of ", t.numel(), " values"));
  try {
    StartAllReduce(*impl_->backend, impl_->device.is_cpu(), tensors, reduce)->wait();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "rank ", rank_, " of ", world_size_, ": all-reduce: ", e.what());
  }
}

std::vector<at::Tensor> RankGroup::AllGather(const at::Tensor& t) const {
  std::vector<at::Tensor> inputs{t.contiguous()};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < world_size_; ++r) outputs[0].push_back(at::empty_like(inputs[0]));
  Trace(rank_, absl::StrCat("all-gather of ", t.numel(), " values"));
  try {
    StartAllGather(*impl_->backend, impl_->device.is_cpu(), outputs, inputs)->wait();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "rank ", rank_, " of ", world_size_, ": all-gather: ", e.what());
  }
  return outputs[0];
}

absl::StatusOr<std::vector<double>> RankGroup::SumAcrossRanks(const std::vector<double>& values) {
  if (world_size_ == 1) return values;
  try {
    at::Tensor t = at::tensor(values, at::TensorOptions().dtype(at::kDouble)).to(impl_->device);
    std::vector<at::Tensor> tensors{t};
    Trace(rank_, absl::StrCat("sum of ", values.size(), " values: start"));
    StartAllReduce(*impl_->backend, impl_->device.is_cpu(), tensors)->wait();
    t = t.cpu();
    Trace(rank_, "sum: done");
    return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("data parallel: all-reduce of the step's values: ", e.what()));
  }
}

}  // namespace oomb
