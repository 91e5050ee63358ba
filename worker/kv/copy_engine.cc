#include "worker/kv/copy_engine.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <system_error>
#include <thread>
#include <unordered_map>

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
// enough to reach PCIe's rate alone, few enough that the trainer's kernels beside it keep most
// SMs and slow down little (more blocks slow them more); see the copy engine's header.
constexpr int kCopyBlocks = 8;
// Thread blocks of an addition into host pages (kernels/page_copy.h LaunchAddRuns): they read
// and write the host's rows, and a kernel writing to the host slows the trainer's kernels
// beside it more than one reading (see the header); a chunk's additions need a few GB/s.
constexpr int kAddBlocks = 4;

// The runs of copying pages `ids` of `pool` to / from the consecutive images at `device`: the
// whole pages, or (`heads` given) the K and V of the KV heads set in heads[i] only, packed one
// [2, page_tokens, head_dim] image per (page, head), pages in order and each page's heads
// ascending. Runs adjacent on both sides merge within one slab. (A run across two slabs whose
// addresses meet is not one pinned allocation: the driver refuses it with cudaErrorInvalidValue.)
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
  int64_t packed = 0;  // (page, head) images so far
  for (size_t i = 0; i < ids.size(); ++i) {
    TORCH_INTERNAL_ASSERT(ids[i].tier() == Tier::kHost, "copy engine: page ", ids[i].raw(), " is not a host page");
    char* host = pool.PageData(ids[i]);
    const bool same_slab = i > 0 && pool.SlabOf(ids[i - 1]) == pool.SlabOf(ids[i]);
    if (heads == nullptr) {
      add(host, device + static_cast<int64_t>(i) * page_bytes, page_bytes, same_slab);
      continue;
    }
    for (int64_t h = 0; h < kv_heads; ++h) {
      if (((*heads)[i] >> h & 1) == 0) continue;
      char* image = device + packed++ * 2 * head_bytes;
      add(host + h * head_bytes, image, head_bytes, same_slab);                       // K
      add(host + (kv_heads + h) * head_bytes, image + head_bytes, head_bytes, true);  // V, same page
    }
  }
  return runs;
}

// One addition into host pages on the CPU: each run's `bytes` at `device` (here a CPU buffer)
// added into its `host`, elements of `dtype`.
struct HostAdd {
  std::vector<CopyRun> runs;
  at::ScalarType dtype = at::kFloat;
};

// bfloat16 <-> float32 as c10::BFloat16 converts (round to nearest even, NaN kept), written on
// the bits so the loop below vectorizes.
inline float Widen(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }
inline uint16_t Narrow(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// -O3 for these loops alone: at -O2 GCC leaves the bfloat16 one scalar, several times slower
// than vectorized.
[[gnu::optimize("O3")]] void AddRun(uint16_t* d, const uint16_t* s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = Narrow(Widen(d[i]) + Widen(s[i]));
}
template <typename T>
[[gnu::optimize("O3")]] void AddRun(T* d, const T* s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] += s[i];
}

template <typename T>
void AddRuns(const HostAdd& a, size_t begin, size_t end) {
  for (size_t r = begin; r < end; ++r) {
    const CopyRun& run = a.runs[r];
    AddRun(reinterpret_cast<T*>(run.host), reinterpret_cast<const T*>(run.device),
           run.bytes / static_cast<int64_t>(sizeof(T)));
  }
}

// Threads one addition on the CPU is split over, and below how many bytes it takes one.
constexpr unsigned kHostAddThreads = 12;
constexpr int64_t kHostAddBytesPerThread = int64_t{4} << 20;

void RunHostAdd(const HostAdd& a, int64_t bytes) {
  const size_t runs = a.runs.size();
  const size_t threads =
      std::clamp<size_t>(std::min<int64_t>(bytes / kHostAddBytesPerThread, kHostAddThreads), 1,
                         std::max<size_t>(1, std::min(runs, size_t{std::thread::hardware_concurrency()})));
  const auto range = [&](size_t t) {
    const size_t begin = runs * t / threads, end = runs * (t + 1) / threads;
    switch (a.dtype) {
      case at::kBFloat16:
        return AddRuns<uint16_t>(a, begin, end);
      case at::kFloat:
        return AddRuns<float>(a, begin, end);
      default:  // at::kDouble (AddToPages admits no other dtype)
        return AddRuns<double>(a, begin, end);
    }
  };
  std::vector<std::thread> workers;
  for (size_t t = 1; t < threads; ++t) {
    try {
      workers.emplace_back(range, t);
    } catch (const std::system_error&) {  // no thread to be had: this one does that part
      range(t);
    }
  }
  range(0);
  for (std::thread& w : workers) w.join();
}

}  // namespace

#if defined(OOMB_HAVE_CUDA)
namespace {

// `descs` in device memory for a kernel on `stream`: uploaded on that stream from pinned memory,
// so without waiting, and allocated on it, so not reused before the kernel is done. [bytes].
at::Tensor UploadDescriptors(const std::vector<kernels::CopyRunDesc>& descs, at::Device device,
                             const c10::cuda::CUDAStream& stream) {
  const auto bytes = static_cast<int64_t>(descs.size() * sizeof(kernels::CopyRunDesc));
  at::Tensor pinned = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::memcpy(pinned.data_ptr(), descs.data(), bytes);
  const c10::cuda::CUDAStreamGuard on_stream(stream);
  return pinned.to(device, /*non_blocking=*/true);
}

// Queues copying `runs` one way on `stream`: a single run is one cudaMemcpyAsync; several are
// one copy kernel to the device, one batched DMA back (see the header).
void QueueCopies(bool to_device, const std::vector<CopyRun>& runs, at::Device device,
                 const c10::cuda::CUDAStream& stream) {
  const auto aligned = [](const CopyRun& r) {
    return (reinterpret_cast<uintptr_t>(r.host) | reinterpret_cast<uintptr_t>(r.device) | r.bytes) % 16 == 0;
  };
  if (runs.empty()) return;
  if (runs.size() == 1) {
    const CopyRun& r = runs[0];
    C10_CUDA_CHECK(cudaMemcpyAsync(to_device ? r.device : r.host, to_device ? r.host : r.device, r.bytes,
                                   to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream));
  } else if (!to_device || !std::all_of(runs.begin(), runs.end(), aligned)) {
    // Every run in one batched DMA: head-sized runs move at PCIe's rate beside the trainer's
    // kernels without slowing them (one cudaMemcpyAsync per run is limited by the host's calls).
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    dsts.reserve(runs.size());
    srcs.reserve(runs.size());
    sizes.reserve(runs.size());
    for (const CopyRun& r : runs) {
      dsts.push_back(to_device ? r.device : r.host);
      srcs.push_back(to_device ? r.host : r.device);
      sizes.push_back(static_cast<size_t>(r.bytes));
    }
    cudaMemcpyAttributes attrs{};
    attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attrs.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t first = 0;
    C10_CUDA_CHECK(
        cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attrs, &first, 1, stream));
  } else {
    // Scattered runs to the device: one kernel launch.
    std::vector<kernels::CopyRunDesc> descs;
    descs.reserve(runs.size());
    for (const CopyRun& r : runs) descs.push_back(kernels::CopyRunDesc{r.host, r.device, r.bytes});
    const std::vector<kernels::CopyRunDesc> segments = kernels::CopySegments(descs);
    const at::Tensor on_device = UploadDescriptors(segments, device, stream);
    C10_CUDA_CHECK(kernels::LaunchCopyRuns(static_cast<const kernels::CopyRunDesc*>(on_device.data_ptr()),
                                           static_cast<int64_t>(segments.size()), kCopyBlocks, stream));
  }
}

}  // namespace

struct CopyEngine::Streams {
  explicit Streams(c10::DeviceIndex index)
      : to_device(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, index)),
        to_host(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index)),
        adds(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, index)) {}
  c10::cuda::CUDAStream& stream(TransferDirection d) {
    return d == TransferDirection::kHostToDevice ? to_device : to_host;
  }
  c10::cuda::CUDAStream to_device;
  c10::cuda::CUDAStream to_host;
  // Additions into host pages, in order (so two never add into one page at once), beside the
  // fetches and write-backs; high priority, as the fetches.
  c10::cuda::CUDAStream adds;
  // Write batches (write-backs and additions) in queue order: `queued` so far, of which the
  // first `done` are known to have ended; ends[i] is the end of batch done + 1 + i. Per pool
  // and slot, the newest batch that wrote the page (0: none).
  int64_t queued = 0, done = 0;
  std::deque<at::cuda::CUDAEvent> ends;
  std::unordered_map<const PagePool*, std::vector<int64_t>> newest;
  // The end of the newest WriteToHost (an upload waits for it).
  at::cuda::CUDAEvent swap_written;
  // Additions queued and not known to be done, oldest first: each one's end and bytes
  // (AddToPages keeps at most kHostAddBytesInFlight of them).
  std::deque<std::pair<at::cuda::CUDAEvent, int64_t>> adds_in_flight;
  int64_t add_bytes_in_flight = 0;
  // Batches whose duration is not known yet (an observer is set).
  struct Timed {
    TransferDirection direction;
    PageKind kind;
    int64_t bytes;
    std::unique_ptr<at::cuda::CUDAEvent> start, end;
  };
  std::vector<Timed> timed;

  // Notes a write batch into `ids` just queued, ending on `stream`.
  void NoteWritten(const PagePool& pool, const std::vector<PageId>& ids, const c10::cuda::CUDAStream& stream) {
    ++queued;
    std::vector<int64_t>& slots = newest[&pool];
    for (const PageId& id : ids) {
      if (slots.size() <= id.slot()) slots.resize(std::max<size_t>(id.slot() + 1, pool.stats().capacity_pages), 0);
      slots[id.slot()] = queued;
    }
    ends.emplace_back();
    ends.back().record(stream);
    Trim();
  }
  // Drops the ends known to have passed, from the oldest.
  void Trim() {
    while (!ends.empty() && ends.front().query()) {
      ends.pop_front();
      ++done;
    }
  }
  // The end of the newest write batch into any of `ids` not known to be done; null: none.
  at::cuda::CUDAEvent* NewestWrite(const PagePool& pool, const std::vector<PageId>& ids) {
    const auto it = newest.find(&pool);
    if (it == newest.end()) return nullptr;
    int64_t latest = 0;
    for (const PageId& id : ids) {
      if (id.slot() < it->second.size()) latest = std::max(latest, it->second[id.slot()]);
    }
    return latest > done ? &ends[latest - done - 1] : nullptr;
  }
  // Makes `stream` wait for the newest write batch into any of `ids`.
  void WaitForWrites(const PagePool& pool, const std::vector<PageId>& ids, const c10::cuda::CUDAStream& stream) {
    if (at::cuda::CUDAEvent* end = NewestWrite(pool, ids)) end->block(stream);
  }
  // Reports the timed batches that have ended (all of them when `wait`).
  void Report(const Observer& observer, bool wait) {
    auto ended = std::stable_partition(timed.begin(), timed.end(), [&](const Timed& t) {
      if (wait) t.end->synchronize();
      return !t.end->query();
    });
    for (auto it = ended; it != timed.end(); ++it) {
      observer(it->direction, it->kind, it->bytes, it->start->elapsed_time(*it->end) / 1000.0);
    }
    timed.erase(ended, timed.end());
  }
  // Waits until `bytes` more of additions fit within kHostAddBytesInFlight (the device holds
  // the contributions of the queued ones); returns the nanoseconds waited.
  int64_t MakeRoomForAdd(int64_t bytes) {
    int64_t waited_ns = 0;
    while (!adds_in_flight.empty() &&
           (adds_in_flight.front().first.query() || add_bytes_in_flight + bytes > kHostAddBytesInFlight)) {
      if (!adds_in_flight.front().first.query()) {
        const auto start = std::chrono::steady_clock::now();
        adds_in_flight.front().first.synchronize();
        waited_ns +=
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
      }
      add_bytes_in_flight -= adds_in_flight.front().second;
      adds_in_flight.pop_front();
    }
    return waited_ns;
  }
  // Notes an addition of `bytes` just queued on `adds`.
  void NoteAddQueued(int64_t bytes) {
    adds_in_flight.emplace_back();
    adds_in_flight.back().first.record(adds);
    adds_in_flight.back().second = bytes;
    add_bytes_in_flight += bytes;
  }
  // Times an addition on `adds` as `bytes` moved both ways (the rows come in and go back over
  // one kernel): StartTimedAdd before its kernel is queued, EndTimedAdd after.
  std::array<Timed, 2> StartTimedAdd() {
    std::array<Timed, 2> both;
    for (Timed& t : both) {
      t.start = std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault);
      t.start->record(adds);
    }
    return both;
  }
  void EndTimedAdd(std::array<Timed, 2> both, PageKind kind, int64_t bytes) {
    for (int way = 0; way < 2; ++way) {
      both[way].direction = way == 0 ? TransferDirection::kHostToDevice : TransferDirection::kDeviceToHost;
      both[way].kind = kind;
      both[way].bytes = bytes;
      both[way].end = std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault);
      both[way].end->record(adds);
      timed.push_back(std::move(both[way]));
    }
  }
  // Waits until every stream's work is done.
  void Fence() {
    to_device.synchronize();
    to_host.synchronize();
    adds.synchronize();
    done = queued;
    ends.clear();
    adds_in_flight.clear();
    add_bytes_in_flight = 0;
  }
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

int64_t PackedImages(const std::vector<uint64_t>& heads) {
  int64_t images = 0;
  for (const uint64_t h : heads) images += std::popcount(h);
  return images;
}

CopyEngine::CopyEngine(at::Device device) : device_(device) {
#if defined(OOMB_HAVE_CUDA)
  if (device_.is_cuda()) streams_ = std::make_unique<Streams>(device_.index());
#endif
}

CopyEngine::~CopyEngine() {
  try {
    Fence();
  } catch (const std::exception&) {  // a failed device: nothing left to wait for
  }
}

std::shared_ptr<PendingFetch> CopyEngine::StartFetch(const PagePool& pool, const std::vector<PageId>& ids,
                                                     const std::vector<uint64_t>* heads) {
  const PageShape& s = pool.shape();
  auto pending = std::make_shared<PendingFetch>();
#if defined(OOMB_HAVE_CUDA)
  // The destination is allocated on the fetch stream: its earlier users were fetches, ordered
  // before this one on that stream, so the copy waits for nothing the caller queued.
  std::optional<c10::cuda::CUDAStreamGuard> on_fetch_stream;
  if (device_.is_cuda()) on_fetch_stream.emplace(streams_->to_device);
#endif
  TORCH_INTERNAL_ASSERT(heads == nullptr || heads->size() == ids.size(), "StartFetch: ", ids.size(), " pages, ",
                        heads == nullptr ? 0 : heads->size(), " head sets");
  const at::TensorOptions options = pool.options().device(device_).pinned_memory(false);
  if (heads == nullptr) {
    pending->pages = at::empty({static_cast<int64_t>(ids.size()), 2, s.kv_heads, s.page_tokens, s.head_dim}, options);
  } else {
    pending->pages = at::empty({PackedImages(*heads), 2, s.page_tokens, s.head_dim}, options);
  }
  const std::vector<CopyRun> runs = Runs(pool, ids, static_cast<char*>(pending->pages.data_ptr()), heads);
  for (const CopyRun& r : runs) bytes_to_device_ += r.bytes;
  if (!device_.is_cuda()) {
    Copy(TransferDirection::kHostToDevice, pool.stats().kind, runs);
    return pending;
  }
#if defined(OOMB_HAVE_CUDA)
  const c10::cuda::CUDAGuard guard(device_);
  streams_->WaitForWrites(pool, ids, streams_->to_device);
  Copy(TransferDirection::kHostToDevice, pool.stats().kind, runs);
  pending->done = std::make_unique<at::cuda::CUDAEvent>();
  pending->done->record(streams_->to_device);
#endif
  return pending;
}

at::Tensor CopyEngine::Await(const std::shared_ptr<PendingFetch>& pending) {
#if defined(OOMB_HAVE_CUDA)
  if (pending->done != nullptr) {
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_.index());
    pending->done->block(current);
    pending->done.reset();
    // Allocated on the fetch stream, used on this one: not reused before this stream is done.
    c10::cuda::CUDACachingAllocator::recordStream(pending->pages.storage().data_ptr(), current);
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
  streams_->WaitForWrites(pool, ids, streams_->to_host);  // after the additions into these pages
  Copy(TransferDirection::kDeviceToHost, pool.stats().kind, runs);
  streams_->NoteWritten(pool, ids, streams_->to_host);
  c10::cuda::CUDACachingAllocator::recordStream(src.storage().data_ptr(), streams_->to_host);
#endif
}

void CopyEngine::AddToPages(PagePool& pool, const std::vector<PageId>& ids, const std::vector<uint64_t>& heads,
                            const at::Tensor& images) {
  const PageShape& s = pool.shape();
  const at::ScalarType dtype = pool.options().dtype().toScalarType();
  const int64_t count = PackedImages(heads);
  TORCH_CHECK(heads.size() == ids.size() && images.dim() == 4 && images.size(0) == count &&
                  images.numel() == count * 2 * s.page_tokens * s.head_dim && images.scalar_type() == dtype &&
                  images.is_contiguous(),
              "AddToPages: expected ", count, " contiguous (page, head) images [", count, ", 2, ", s.page_tokens, ", ",
              s.head_dim, "] of ", dtype, " for ", ids.size(), " pages, got ", images.sizes(), " of ",
              images.scalar_type(), " and ", heads.size(), " head sets");
  // Checked here, before anything is queued.
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kFloat || dtype == at::kDouble, "AddToPages: pages of ", dtype,
              " are not supported");
  if (count == 0) return;
  // Each image's K and V rows into the page's runs of that head, as a fetch of those heads
  // copies them the other way.
  const HostAdd add{.runs = Runs(pool, ids, static_cast<char*>(images.data_ptr()), &heads), .dtype = dtype};
  const int64_t bytes = images.numel() * static_cast<int64_t>(images.element_size());
  bytes_to_host_ += bytes;
  if (!images.is_cuda()) {
    const auto start = std::chrono::steady_clock::now();
    RunHostAdd(add, bytes);
    if (observer_) {
      observer_(TransferDirection::kDeviceToHost, pool.stats().kind, bytes,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return;
  }
#if defined(OOMB_HAVE_CUDA)
  const int64_t row_bytes = s.page_tokens * s.head_dim * static_cast<int64_t>(c10::elementSize(dtype));
  TORCH_CHECK(row_bytes % 16 == 0, "AddToPages on a GPU: a head's rows of a page (", s.page_tokens, " tokens x ",
              s.head_dim, " x ", c10::elementSize(dtype), " bytes) must be a multiple of 16 bytes");
  const c10::cuda::CUDAGuard guard(device_);
  Streams& st = *streams_;
  add_wait_ns_ += st.MakeRoomForAdd(bytes);
  // One kernel on the additions' stream, once the current stream has made the contributions
  // and after the newest write into the pages: each run of `images` added into its host run.
  at::cuda::CUDAEvent ready;
  ready.record(c10::cuda::getCurrentCUDAStream(device_.index()));
  ready.block(st.adds);
  st.WaitForWrites(pool, ids, st.adds);
  std::vector<kernels::CopyRunDesc> runs;
  runs.reserve(add.runs.size());
  for (const CopyRun& r : add.runs) runs.push_back({r.device, r.host, r.bytes});
  const kernels::AddType type = dtype == at::kBFloat16 ? kernels::AddType::kBFloat16
                                : dtype == at::kFloat  ? kernels::AddType::kFloat32
                                                       : kernels::AddType::kFloat64;
  std::array<Streams::Timed, 2> timed;
  if (observer_) timed = st.StartTimedAdd();
  const std::vector<kernels::CopyRunDesc> segments = kernels::CopySegments(runs);
  const at::Tensor descriptors = UploadDescriptors(segments, device_, st.adds);
  C10_CUDA_CHECK(kernels::LaunchAddRuns(static_cast<const kernels::CopyRunDesc*>(descriptors.data_ptr()),
                                        static_cast<int64_t>(segments.size()), type, kAddBlocks, st.adds));
  if (observer_) st.EndTimedAdd(std::move(timed), pool.stats().kind, bytes);
  bytes_to_device_ += bytes;
  c10::cuda::CUDACachingAllocator::recordStream(images.storage().data_ptr(), st.adds);
  st.NoteWritten(pool, ids, st.adds);
  st.NoteAddQueued(bytes);
#endif
}

at::Tensor CopyEngine::HostBuffer(int64_t bytes) const {
  const at::TensorOptions options = at::TensorOptions().dtype(at::kByte);
  if (!device_.is_cuda()) return at::empty({bytes}, options);
#if defined(OOMB_HAVE_CUDA)
  void* data = nullptr;
  C10_CUDA_CHECK(cudaHostAlloc(&data, static_cast<size_t>(std::max<int64_t>(bytes, 1)), cudaHostAllocDefault));
  return at::from_blob(
      data, {bytes}, [](void* p) { cudaFreeHost(p); }, options);
#else
  return at::empty({bytes}, options);
#endif
}

void CopyEngine::WriteToHost(const at::Tensor& src, const at::Tensor& host) {
  TORCH_CHECK(src.is_contiguous() && host.is_contiguous() && host.nbytes() >= src.nbytes() && !host.is_cuda(),
              "WriteToHost: a contiguous tensor of ", src.nbytes(), " bytes into a contiguous host tensor of ",
              host.nbytes());
  const std::vector<CopyRun> runs = {
      {static_cast<char*>(host.data_ptr()), static_cast<char*>(src.data_ptr()), static_cast<int64_t>(src.nbytes())}};
  bytes_to_host_ += runs[0].bytes;
  if (!src.is_cuda()) {
    Copy(TransferDirection::kDeviceToHost, PageKind::kSwap, runs);
    return;
  }
#if defined(OOMB_HAVE_CUDA)
  const c10::cuda::CUDAGuard guard(device_);
  at::cuda::CUDAEvent ready;
  ready.record(c10::cuda::getCurrentCUDAStream(device_.index()));
  ready.block(streams_->to_host);
  Copy(TransferDirection::kDeviceToHost, PageKind::kSwap, runs);
  streams_->swap_written.record(streams_->to_host);
  c10::cuda::CUDACachingAllocator::recordStream(src.storage().data_ptr(), streams_->to_host);
#endif
}

std::shared_ptr<PendingFetch> CopyEngine::StartUpload(const at::Tensor& host) {
  TORCH_CHECK(host.is_contiguous() && !host.is_cuda(), "StartUpload: a contiguous host tensor");
  auto pending = std::make_shared<PendingFetch>();
#if defined(OOMB_HAVE_CUDA)
  // Allocated on the fetch stream, as StartFetch's destinations.
  std::optional<c10::cuda::CUDAStreamGuard> on_fetch_stream;
  if (device_.is_cuda()) on_fetch_stream.emplace(streams_->to_device);
#endif
  pending->pages = at::empty(host.sizes(), at::TensorOptions().dtype(host.scalar_type()).device(device_));
  const std::vector<CopyRun> runs = {{static_cast<char*>(host.data_ptr()),
                                      static_cast<char*>(pending->pages.data_ptr()),
                                      static_cast<int64_t>(host.nbytes())}};
  bytes_to_device_ += runs[0].bytes;
  if (!device_.is_cuda()) {
    Copy(TransferDirection::kHostToDevice, PageKind::kSwap, runs);
    return pending;
  }
#if defined(OOMB_HAVE_CUDA)
  const c10::cuda::CUDAGuard guard(device_);
  streams_->swap_written.block(streams_->to_device);
  Copy(TransferDirection::kHostToDevice, PageKind::kSwap, runs);
  pending->done = std::make_unique<at::cuda::CUDAEvent>();
  pending->done->record(streams_->to_device);
#endif
  return pending;
}

void CopyEngine::FencePages(const PagePool& pool, const std::vector<PageId>& ids) {
#if defined(OOMB_HAVE_CUDA)
  if (streams_ == nullptr) return;
  at::cuda::CUDAEvent fetched;  // the fetches queued so far (an event: nothing else waits)
  fetched.record(streams_->to_device);
  fetched.synchronize();
  if (at::cuda::CUDAEvent* end = streams_->NewestWrite(pool, ids)) end->synchronize();
  streams_->Trim();
  if (observer_) streams_->Report(observer_, /*wait=*/false);
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
  QueueCopies(to_device, runs, device_, stream);
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
    streams_->Fence();
    if (observer_) streams_->Report(observer_, /*wait=*/true);
  }
#endif
}

}  // namespace oomb
