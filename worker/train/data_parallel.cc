#include "worker/train/data_parallel.h"

// The PyPI wheel's libtorch_cpu and libtorch_cuda export both process groups; the Gloo and
// NCCL headers they need come from worker/CMakeLists.txt (OOMB_HAVE_NCCL: NCCL's were found).
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef OOMB_HAVE_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"

namespace oomb {
namespace {

// LibTorch 2.11's c10d FlightRecorder (a process-wide singleton every process group records its
// collectives in) inserts a new group's status into a std::map before taking its own lock, so
// two groups of one process starting collectives at the same time can corrupt that map (seen:
// a crash in std::_Rb_tree_insert_and_rebalance under recordWithResetEnabled, with two ranks
// as threads). Every collective of this file is started under this lock; waiting for it is not.
std::mutex& EnqueueMutex() {
  static std::mutex mu;
  return mu;
}

c10::intrusive_ptr<c10d::Work> StartAllReduce(c10d::Backend& backend, std::vector<at::Tensor>& tensors) {
  std::lock_guard<std::mutex> lock(EnqueueMutex());
  return backend.allreduce(tensors);
}

}  // namespace

struct Rendezvous::Store {
  c10::intrusive_ptr<c10d::Store> store;
};

Rendezvous Rendezvous::InProcess() {
  return Rendezvous{std::make_shared<Store>(Store{c10::make_intrusive<c10d::HashStore>()})};
}

Rendezvous Rendezvous::File(const std::string& path, int world_size) {
  return Rendezvous{std::make_shared<Store>(Store{c10::make_intrusive<c10d::FileStore>(path, world_size)})};
}

struct DataParallelGroup::Impl {
  at::Device device = at::kCPU;
  c10::intrusive_ptr<c10d::Backend> backend;
};

DataParallelGroup::DataParallelGroup(int rank, int world_size, std::unique_ptr<Impl> impl)
    : rank_(rank), world_size_(world_size), impl_(std::move(impl)) {}

DataParallelGroup::~DataParallelGroup() = default;

absl::StatusOr<std::unique_ptr<DataParallelGroup>> DataParallelGroup::Join(const Rendezvous& rendezvous, int rank,
                                                                           int world_size, at::Device device,
                                                                           absl::Duration timeout) {
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
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = timeout_ms;
      impl->backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(rendezvous.store->store, rank, world_size, options);
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
  return std::unique_ptr<DataParallelGroup>(new DataParallelGroup(rank, world_size, std::move(impl)));
}

absl::Status DataParallelGroup::AllReduceGradients(const std::vector<at::Tensor>& params, int64_t bucket_bytes) {
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
      b.work = StartAllReduce(*impl_->backend, tensors);
    }
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

absl::StatusOr<std::vector<double>> DataParallelGroup::SumAcrossRanks(const std::vector<double>& values) {
  if (world_size_ == 1) return values;
  try {
    at::Tensor t = at::tensor(values, at::TensorOptions().dtype(at::kDouble)).to(impl_->device);
    std::vector<at::Tensor> tensors{t};
    StartAllReduce(*impl_->backend, tensors)->wait();
    t = t.cpu();
    return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("data parallel: all-reduce of the step's values: ", e.what()));
  }
}

}  // namespace oomb
