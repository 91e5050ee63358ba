#include "worker/kv/copy_engine.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "kernels/page_copy.h"

#if defined(OOMB_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace oomb {

// One contiguous copy: `bytes` from `host` to `device` (or back).
struct CopyRun {
  char* host;
  char* device;
  int64_t bytes;
};

namespace {

// Thread blocks (so SMs, at most) a fetch's copy kernel occupies beside the trainer's compute:
// on the H100, 8 blocks copy scattered pages at 50 GB/s alone and slowed a concurrent matmul by
// 4-9% (16 blocks: 11-13%); see the copy engine's header.
constexpr int kCopyBlocks = 8;

// The runs of copying pages `ids` of `pool` to / from the consecutive images at `device`: the
// whole pages, or (`heads` given) the K and V of the KV heads set in heads[i] only. Runs
// adjacent on both sides merge within one slab. (A run across two slabs whose addresses meet
// is not one pinned allocation: the driver refuses it with cudaErrorInvalidValue.)
std::vector<CopyRun> Runs(const PagePool& pool, const std::vector<PageId>& ids, char* device,
                          const std::vector<uint64_t>* heads = nullptr) {
  const int64_t page_bytes = pool.stats().bytes_per_page, kv_heads = pool.shape().kv_heads;
  const int64_t head_bytes = page_bytes / (2 * kv_heads);
  std::vector<CopyRun> runs;
  auto add = [&](char* host, char* dev, int64_t bytes, bool same_slab) {
    if (same_slab && !runs.empty() && runs.back().host + runs.back().bytes == host &&
        runs.back().device + runs.back().bytes == dev) {
      runs.back().bytes += bytes;
    } else {
      runs.push_back({host, dev, bytes});
    }
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    TORCH_INTERNAL_ASSERT(ids[i].tier() == Tier::kHost, "copy engine: page ", ids[i].raw(), " is not a host page");
    char* host = static_cast<char*>(pool.Page(ids[i]).data_ptr());
    char* dev = device + static_cast<int64_t>(i) * page_bytes;
    const bool same_slab = i > 0 && pool.SlabOf(ids[i - 1]) == pool.SlabOf(ids[i]);
    if (heads == nullptr) {
      add(host, dev, page_bytes, same_slab);
      continue;
    }
    bool first = true;
    for (int64_t kv = 0; kv < 2; ++kv) {
      for (int64_t h = 0; h < kv_heads; ++h) {
        if (((*heads)[i] >> h & 1) == 0) continue;
        const int64_t offset = (kv * kv_heads + h) * head_bytes;
        add(host + offset, dev + offset, head_bytes, same_slab || !first);
        first = false;
      }
    }
  }
  return runs;
}

}  // namespace

#if defined(OOMB_HAVE_CUDA)
struct CopyEngine::Streams {
  explicit Streams(c10::DeviceIndex index)
      : to_device(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index)),
        to_host(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index)) {}
  c10::cuda::CUDAStream& stream(TransferDirection d) {
    return d == TransferDirection::kHostToDevice ? to_device : to_host;
  }
  c10::cuda::CUDAStream to_device;
  c10::cuda::CUDAStream to_host;
  at::cuda::CUDAEvent last_write;  // the newest write-back's end (unrecorded: none yet)
  // Batches whose duration is not known yet (an observer is set).
  struct Timed {
    TransferDirection direction;
    PageKind kind;
    int64_t bytes;
    std::unique_ptr<at::cuda::CUDAEvent> start, end;
  };
  std::vector<Timed> timed;
};
#else
struct CopyEngine::Streams {};
#endif

class PendingFetch {
 public:
  at::Tensor pages;
#if defined(OOMB_HAVE_CUDA)
  std::unique_ptr<at::cuda::CUDAEvent> done;  // null on the CPU
#endif
};

CopyEngine::CopyEngine(at::Device device) : device_(device) {
#if defined(OOMB_HAVE_CUDA)
  if (device_.is_cuda()) streams_ = std::make_unique<Streams>(device_.index());
#endif
}

CopyEngine::~CopyEngine() {
  try {
    Fence();
  } catch (const c10::Error&) {  // a failed device: nothing left to wait for
  }
}

std::shared_ptr<PendingFetch> CopyEngine::StartFetch(const PagePool& pool, const std::vector<PageId>& ids,
                                                     const std::vector<uint64_t>* heads) {
  const PageShape& s = pool.shape();
  auto pending = std::make_shared<PendingFetch>();
  pending->pages = at::empty({static_cast<int64_t>(ids.size()), 2, s.kv_heads, s.page_tokens, s.head_dim},
                             pool.options().device(device_).pinned_memory(false));
  TORCH_INTERNAL_ASSERT(heads == nullptr || heads->size() == ids.size(), "StartFetch: ", ids.size(), " pages, ",
                        heads == nullptr ? 0 : heads->size(), " head sets");
  const std::vector<CopyRun> runs = Runs(pool, ids, static_cast<char*>(pending->pages.data_ptr()), heads);
  for (const CopyRun& r : runs) bytes_to_device_ += r.bytes;
  if (!device_.is_cuda()) {
    Copy(TransferDirection::kHostToDevice, pool.stats().kind, runs);
    return pending;
  }
#if defined(OOMB_HAVE_CUDA)
  const c10::cuda::CUDAGuard guard(device_);
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_.index());
  at::cuda::CUDAEvent ready;
  ready.record(current);
  ready.block(streams_->to_device);
  if (streams_->last_write.isCreated()) streams_->last_write.block(streams_->to_device);
  Copy(TransferDirection::kHostToDevice, pool.stats().kind, runs);
  pending->done = std::make_unique<at::cuda::CUDAEvent>();
  pending->done->record(streams_->to_device);
  // Freed on the current stream once the caller is done: not before the copy into it ends.
  c10::cuda::CUDACachingAllocator::recordStream(pending->pages.storage().data_ptr(), streams_->to_device);
#endif
  return pending;
}

at::Tensor CopyEngine::Await(const std::shared_ptr<PendingFetch>& pending) {
#if defined(OOMB_HAVE_CUDA)
  if (pending->done != nullptr) {
    pending->done->block(c10::cuda::getCurrentCUDAStream(device_.index()));
    pending->done.reset();
  }
#endif
  return pending->pages;
}

void CopyEngine::WritePages(PagePool& pool, const std::vector<PageId>& ids, const at::Tensor& images) {
  const at::Tensor src = images.to(pool.options().dtype()).contiguous();
  TORCH_CHECK(src.dim() == 5 && src.size(0) == static_cast<int64_t>(ids.size()) &&
                  src.numel() == static_cast<int64_t>(ids.size()) * pool.shape().elems(),
              "WritePages: expected ", ids.size(), " page images, got ", images.sizes());
  const std::vector<CopyRun> runs = Runs(pool, ids, static_cast<char*>(src.data_ptr()));
  for (const CopyRun& r : runs) bytes_to_host_ += r.bytes;
  if (!src.is_cuda()) {
    Copy(TransferDirection::kDeviceToHost, pool.stats().kind, runs);
    return;
  }
#if defined(OOMB_HAVE_CUDA)
  const c10::cuda::CUDAGuard guard(device_);
  at::cuda::CUDAEvent ready;
  ready.record(c10::cuda::getCurrentCUDAStream(device_.index()));
  ready.block(streams_->to_host);
  Copy(TransferDirection::kDeviceToHost, pool.stats().kind, runs);
  streams_->last_write.record(streams_->to_host);
  c10::cuda::CUDACachingAllocator::recordStream(src.storage().data_ptr(), streams_->to_host);
#endif
}

void CopyEngine::Copy(TransferDirection direction, PageKind kind, const std::vector<CopyRun>& runs) {
  int64_t bytes = 0;
  for (const CopyRun& r : runs) bytes += r.bytes;
  const bool to_device = direction == TransferDirection::kHostToDevice;
  if (!device_.is_cuda()) {
    const auto start = std::chrono::steady_clock::now();
    for (const CopyRun& r : runs) std::memcpy(to_device ? r.device : r.host, to_device ? r.host : r.device, r.bytes);
    if (observer_) {
      observer_(direction, kind, bytes,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return;
  }
#if defined(OOMB_HAVE_CUDA)
  c10::cuda::CUDAStream& stream = streams_->stream(direction);
  Streams::Timed timed{direction, kind, bytes, nullptr, nullptr};
  if (observer_) {
    timed.start = std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault);
    timed.start->record(stream);
  }
  const auto aligned = [](const CopyRun& r) {
    return (reinterpret_cast<uintptr_t>(r.host) | reinterpret_cast<uintptr_t>(r.device) | r.bytes) % 16 == 0;
  };
  if (!to_device || runs.size() <= 1 || !std::all_of(runs.begin(), runs.end(), aligned)) {
    for (const CopyRun& r : runs) {
      C10_CUDA_CHECK(cudaMemcpyAsync(to_device ? r.device : r.host, to_device ? r.host : r.device, r.bytes,
                                     to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream));
    }
  } else {
    // Scattered runs to the device: one kernel launch, its descriptors uploaded on the same
    // stream (pinned, so without waiting; allocated on that stream, so not reused before the
    // kernel is done).
    at::Tensor descriptors = at::empty({static_cast<int64_t>(runs.size() * sizeof(kernels::CopyRunDesc))},
                                       at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    auto* d = reinterpret_cast<kernels::CopyRunDesc*>(descriptors.data_ptr());
    for (size_t i = 0; i < runs.size(); ++i) d[i] = kernels::CopyRunDesc{runs[i].host, runs[i].device, runs[i].bytes};
    const c10::cuda::CUDAStreamGuard on_copy_stream(stream);
    const at::Tensor on_device = descriptors.to(device_, /*non_blocking=*/true);
    C10_CUDA_CHECK(kernels::LaunchCopyRuns(static_cast<const kernels::CopyRunDesc*>(on_device.data_ptr()),
                                           static_cast<int64_t>(runs.size()), kCopyBlocks, stream));
  }
  if (observer_) {
    timed.end = std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault);
    timed.end->record(stream);
    streams_->timed.push_back(std::move(timed));
  }
#endif
}

void CopyEngine::Fence() {
#if defined(OOMB_HAVE_CUDA)
  if (streams_ != nullptr) {
    streams_->to_device.synchronize();
    streams_->to_host.synchronize();
    for (const Streams::Timed& t : streams_->timed) {
      observer_(t.direction, t.kind, t.bytes, t.start->elapsed_time(*t.end) / 1000.0);
    }
    streams_->timed.clear();
  }
#endif
}

}  // namespace oomb
