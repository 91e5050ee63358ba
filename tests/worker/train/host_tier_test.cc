// The host tier of KV pages (ARCHITECTURE.md §4) on the CPU path: host pools allocated in slabs
// by a background thread, placement (device pages first, the rest on the host), every cache
// operation giving bit-identical results whichever tier a page lives on, the copy engine's
// batching and accounting, and whole training steps, dense and sparse, bit-identical to
// training with every page on the device.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/worker/train/tiny_model.h"
#include "worker/kv/copy_engine.h"
#include "worker/kv/kv_pools.h"
#include "worker/kv/page_pool.h"
#include "worker/train/chunk_trainer.h"

namespace oomb {
namespace {

using testing::Grads;
using testing::TakeGrads;

const PageShape kShape{2, 4, 8};  // kv_heads, page_tokens, head_dim

// Where the "device" tier is and its dtypes: the CPU in float64, or a GPU (pinned host pools)
// in float32, the dtype the CUDA gradient accumulation takes.
struct Target {
  at::Device device;
  at::ScalarType dtype;
};
const Target kCpu{at::Device(at::kCPU), at::kDouble};
const Target kCuda{at::Device(at::kCUDA, 0), at::kFloat};

at::Tensor Random(std::vector<int64_t> sizes, uint64_t seed, const Target& t = kCpu) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn(sizes, gen, at::TensorOptions().dtype(at::kDouble)).to(t.device, t.dtype);
}

// Bit for bit, or (tolerance > 0) within tolerance of the largest magnitude of `want`.
void ExpectSame(const at::Tensor& got, const at::Tensor& want, const std::string& what, double tolerance = 0) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double diff = (got - want).abs().max().item<double>();
  if (tolerance == 0) {
    EXPECT_TRUE(at::equal(got, want)) << what << ": max difference " << diff;
  } else {
    EXPECT_LE(diff, tolerance * want.abs().max().item<double>()) << what;
  }
}

// Slabs land in the background; every page handed out is zeroed and distinct; a full pool says
// so; capacity, ready pages and the page size are what was asked for.
TEST(HostPoolTest, SlabsArriveInTheBackgroundAndPagesAreZeroed) {
  const int64_t page_bytes = kShape.elems() * 8;
  auto pool = PagePool::CreateHost(PageKind::kKvGrad, kShape, at::kDouble, 10, /*pinned=*/false,
                                   /*slab_bytes=*/3 * page_bytes);
  std::vector<PageId> ids;
  for (int i = 0; i < 10; ++i) {
    auto id = pool->Allocate();
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(id->tier(), Tier::kHost);
    EXPECT_EQ(pool->Page(*id).abs().sum().item<double>(), 0.0);
    pool->Page(*id).fill_(i + 1);
    ids.push_back(*id);
  }
  EXPECT_EQ(pool->ready_pages(), 10);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(pool->Page(ids[i]).mean().item<double>(), i + 1) << "page " << i;
  EXPECT_EQ(pool->Allocate().status().code(), absl::StatusCode::kResourceExhausted);
  pool->Free(ids[4]);
  auto again = pool->Allocate();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->slot(), ids[4].slot());
  EXPECT_EQ(pool->Page(*again).abs().sum().item<double>(), 0.0);
  const PoolStats s = pool->stats();
  EXPECT_EQ(s.tier, Tier::kHost);
  EXPECT_EQ(s.capacity_pages, 10);
  EXPECT_EQ(s.used_pages, 10);
  EXPECT_EQ(s.bytes_per_page, page_bytes);
}

// A host pool of gradient pages zeroes a freed page on its own thread, before anyone allocates
// it again (so the training thread does not); a KV pool leaves it as it was.
TEST(HostPoolTest, GradientPagesAreZeroedInTheBackgroundOnceFreed) {
  for (const PageKind kind : {PageKind::kKvGrad, PageKind::kKv}) {
    auto pool = PagePool::CreateHost(kind, kShape, at::kDouble, 4, /*pinned=*/false);
    std::vector<PageId> ids;
    for (int i = 0; i < 4; ++i) {
      auto id = pool->Allocate();
      ASSERT_TRUE(id.ok()) << id.status();
      pool->Page(*id).fill_(i + 1);
      ids.push_back(*id);
    }
    pool->Free(ids[2]);
    const at::Tensor freed = pool->Page(ids[2]);  // still the slot's memory
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (kind == PageKind::kKvGrad && freed.abs().sum().item<double>() != 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(freed.abs().sum().item<double>(), kind == PageKind::kKvGrad ? 0.0 : 3.0 * kShape.elems())
        << KindName(kind);
    EXPECT_EQ(pool->Page(ids[1]).mean().item<double>(), 2.0) << "a page in use is left alone";
    auto again = pool->Allocate();
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->slot(), ids[2].slot());
    EXPECT_EQ(pool->Page(*again).abs().sum().item<double>(), 0.0) << KindName(kind);
  }
}

// Pools whose device tier holds `device_pages` pages and whose host tier (slabs of 5 pages, so a
// sequence spans several) holds `host_pages`; `grad_dtype`: the gradient pages' storage
// (Undefined: the target's dtype).
OwnedKvPools MakeTiers(int64_t device_pages, int64_t host_pages, const Target& target = kCpu,
                       at::ScalarType grad_dtype = at::ScalarType::Undefined) {
  if (grad_dtype == at::ScalarType::Undefined) grad_dtype = target.dtype;
  auto pools =
      MakeKvPools(kShape, target.dtype, grad_dtype, target.device, KvPoolSizes::Pairs(device_pages, host_pages),
                  /*host_slab_bytes=*/5 * kShape.elems() * 8);
  EXPECT_TRUE(pools.ok()) << pools.status();
  return *std::move(pools);
}

// Every cache operation, through both caches, on the same inputs: chunks of 6 tokens over pages
// of 4 (so host pages are also written partly, twice), reads of ranges that straddle the tiers,
// prefetched and not, gradients accumulated and read back, sparse gathers and page gradients
// (prefetched and not, and a prefetch overtaken by a write), and release in reverse chunk order.
void CheckEveryCacheOperation(const Target& target) {
  const int64_t layers = 2, chunk = 6, chunks = 5, T = chunk * chunks;
  const int64_t pages = layers * (T / kShape.page_tokens + 1);
  OwnedKvPools device_only = MakeTiers(pages, 0, target);
  OwnedKvPools tiered = MakeTiers(5, pages, target);
  SequenceKvCache a(device_only.pools(), layers), b(tiered.pools(), layers);
  for (int64_t i = 0; i < chunks; ++i) {
    for (int64_t l = 0; l < layers; ++l) {
      const at::Tensor k = Random({chunk, kShape.kv_heads, kShape.head_dim}, 100 + 10 * i + l, target);
      const at::Tensor v = Random({chunk, kShape.kv_heads, kShape.head_dim}, 200 + 10 * i + l, target);
      ASSERT_TRUE(a.Append(l, k, v).ok());
      ASSERT_TRUE(b.Append(l, k, v).ok());
    }
  }
  EXPECT_EQ(tiered.kv->stats().used_pages, 5);
  EXPECT_GT(tiered.kv_host->stats().used_pages, 0);
  EXPECT_EQ(tiered.kv->stats().used_pages + tiered.kv_host->stats().used_pages, device_only.kv->stats().used_pages);

  for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{{0, T}, {3, 17}, {13, 29}, {20, 21}}) {
    for (int64_t l = 0; l < layers; ++l) {
      const std::string what =
          "layer " + std::to_string(l) + " [" + std::to_string(begin) + ", " + std::to_string(end) + ")";
      auto [ka, va] = a.Read(l, begin, end);
      ASSERT_TRUE(b.Prefetch(l, begin, end).ok());
      auto [kb, vb] = b.Read(l, begin, end);
      ExpectSame(kb, ka, "K " + what);
      ExpectSame(vb, va, "V " + what);
      auto [kc, vc] = b.Read(l, begin, end);  // no prefetch
      ExpectSame(kc, ka, "K again " + what);
    }
  }

  for (int64_t l = 0; l < layers; ++l) {
    // A prefetch of gradient pages [0, 24) that a write to some of them overtakes: it must be
    // dropped, not used stale by the later accumulation into exactly those pages.
    ASSERT_TRUE(b.Prefetch(l, 0, 24, /*with_grads=*/true).ok());
    for (const auto& [begin, n] : std::vector<std::pair<int64_t, int64_t>>{{5, 11}, {0, 24}, {0, 8}}) {
      const at::Tensor dk = Random({kShape.kv_heads, n, kShape.head_dim}, 300 + begin + l, target);
      const at::Tensor dv = Random({kShape.kv_heads, n, kShape.head_dim}, 400 + begin + l, target);
      ASSERT_TRUE(a.AccumulateGrad(l, begin, dk, dv).ok());
      ASSERT_TRUE(b.AccumulateGrad(l, begin, dk, dv).ok());
    }
    auto [ga, gva] = a.ReadGrad(l, 0, T);
    auto [gb, gvb] = b.ReadGrad(l, 0, T);
    ExpectSame(gb, ga, "dK layer " + std::to_string(l));
    ExpectSame(gvb, gva, "dV layer " + std::to_string(l));
  }

  // Sparse: selections over the 7 full pages of a layer, with repeats and -1.
  const at::Tensor selection =
      at::tensor({0, 6, 3, -1, 2, 2, 5, 1, 4, -1, 6, 0}, at::kLong).view({3, 2, 2}).to(target.device);
  const at::Tensor host_selection = selection.cpu().to(at::kInt);
  {
    // Two gathers started at once (stage 1's two chunks in flight), collected in the other
    // order: each collects its own fetch, and nothing more comes over. One handed to another
    // layer's gather is left alone, and that gather fetches for itself.
    SequenceKvCache::PagesInFlight started[2] = {b.StartGather(0, host_selection), b.StartGather(1, host_selection)};
    EXPECT_NE(started[0].fetch, nullptr);
    EXPECT_NE(started[1].fetch, nullptr);
    const int64_t fetched = tiered.copies->bytes_to_device();
    for (const int64_t l : {1, 0}) {
      auto [ka, va] = a.GatherPages(l, selection, host_selection);
      auto [kb, vb] = b.GatherPages(l, selection, host_selection, &started[l]);
      ExpectSame(kb, ka, "K, gather started early");
      ExpectSame(vb, va, "V, gather started early");
      EXPECT_EQ(started[l].fetch, nullptr);
    }
    EXPECT_EQ(tiered.copies->bytes_to_device(), fetched);
    SequenceKvCache::PagesInFlight other = b.StartGather(0, host_selection);
    ExpectSame(b.GatherPages(1, selection, host_selection, &other).first,
               a.GatherPages(1, selection, host_selection).first, "K, another layer's gather handed in");
    EXPECT_NE(other.fetch, nullptr);
    EXPECT_GT(tiered.copies->bytes_to_device(), fetched);
  }
  for (int64_t l = 0; l < layers; ++l) {
    // Layer 0 prefetched (pages and their gradients), layer 1 not.
    if (l == 0) {
      ASSERT_TRUE(b.PrefetchPages(l, host_selection, /*with_grads=*/true).ok());
    }
    auto [ka, va] = a.GatherPages(l, selection, host_selection);
    const int64_t fetched_before = tiered.copies->bytes_to_device();
    auto [kb, vb] = b.GatherPages(l, selection, host_selection);
    ExpectSame(kb, ka, "gathered K");
    ExpectSame(vb, va, "gathered V");
    if (l == 1) {
      // Of a host page, only the K and V of the heads that select it come over. Layer 1's
      // pages 0 and 1 are on the device (the device pool's 5 pages went to layer 0's pages
      // 0-2 and layer 1's 0-1); of its host pages, page 6 is selected by both heads and pages
      // 2, 3, 4 and 5 by one: 6 heads' K and V, not 5 whole pages.
      const int64_t head_bytes = kShape.page_tokens * kShape.head_dim * at::elementSize(target.dtype);
      EXPECT_EQ(tiered.copies->bytes_to_device() - fetched_before, 6 * 2 * head_bytes);
    }
    // A write to the prefetched gradient pages overtakes the prefetch: the page gradients that
    // follow must add into the written pages, not into the stale prefetched images.
    const at::Tensor dk_range = Random({kShape.kv_heads, 16, kShape.head_dim}, 700 + l, target);
    ASSERT_TRUE(a.AccumulateGrad(l, 4, dk_range, dk_range).ok());
    ASSERT_TRUE(b.AccumulateGrad(l, 4, dk_range, dk_range).ok());
    const at::Tensor dk = Random(ka.sizes().vec(), 500 + l, target), dv = Random(ka.sizes().vec(), 600 + l, target);
    ASSERT_TRUE(a.AccumulatePageGrad(l, selection, host_selection, dk, dv).ok());
    const int64_t to_device_before = tiered.copies->bytes_to_device();
    const int64_t to_host_before = tiered.copies->bytes_to_host();
    ASSERT_TRUE(b.AccumulatePageGrad(l, selection, host_selection, dk, dv).ok());
    // Only the heads that select a host gradient page add into it: on the GPU their rows of
    // the page come in and go back, on the CPU the host adds them (nothing comes in). A
    // gradient page is on its KV page's tier: layer 1's pages 0 and 1 on the device, the rest
    // on the host. Head 0 selects pages 0, 2, 4, 6 and head 1 pages 0, 1, 3, 5, 6: of host
    // pages, 6 heads' dK and dV.
    const int64_t sent = tiered.copies->bytes_to_host() - to_host_before;
    EXPECT_EQ(tiered.copies->bytes_to_device() - to_device_before, target.device.is_cuda() ? sent : 0);
    if (l == 1) {
      const int64_t head_bytes = kShape.page_tokens * kShape.head_dim * at::elementSize(target.dtype);
      EXPECT_EQ(sent, 6 * 2 * head_bytes);
    }
    // Prefetched and consumed as it is.
    ASSERT_TRUE(b.PrefetchPages(l, host_selection, /*with_grads=*/true).ok());
    ASSERT_TRUE(a.AccumulatePageGrad(l, selection, host_selection, dv, dk).ok());
    ASSERT_TRUE(b.AccumulatePageGrad(l, selection, host_selection, dv, dk).ok());
    auto [ga, gva] = a.ReadGrad(l, 0, T);
    auto [gb, gvb] = b.ReadGrad(l, 0, T);
    const double tolerance = target.device.is_cuda() ? 1e-6 : 0;
    ExpectSame(gb, ga, "dK after page gradients", tolerance);
    ExpectSame(gvb, gva, "dV after page gradients", tolerance);
  }
  EXPECT_GT(tiered.copies->bytes_to_device(), 0);
  EXPECT_GT(tiered.copies->bytes_to_host(), 0);

  for (int64_t i = chunks - 1; i >= 0; --i) {
    a.ReleaseFrom(i * chunk);
    b.ReleaseFrom(i * chunk);
    for (int64_t l = 0; l < layers; ++l) {
      if (i == 0) continue;
      ExpectSame(b.Read(l, 0, i * chunk).first, a.Read(l, 0, i * chunk).first, "after release");
    }
  }
  for (const PagePool* p : {tiered.kv.get(), tiered.grad.get(), tiered.kv_host.get(), tiered.grad_host.get()}) {
    EXPECT_EQ(p->stats().used_pages, 0);
  }
}

TEST(HostTierTest, EveryCacheOperationEqualsTheDeviceOnlyCache) { CheckEveryCacheOperation(kCpu); }

// The same on a GPU with pinned host slabs and the copy engine's streams and events (gpu
// label: skipped without a device). Index-add accumulation into gathered pages on the GPU
// adds repeated pages in an unspecified order, so page gradients of a selection with repeats
// may differ in the last bit: everything else is compared bit for bit.
TEST(HostTierGpuTest, EveryCacheOperationEqualsTheDeviceOnlyCache) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  CheckEveryCacheOperation(kCuda);
}

// SequenceKvCache::DropGradients (SpaCO): a page all of whose tokens are dropped gets no
// gradient page and keeps nothing AccumulateGrad and AccumulatePageGrad add (dense ranges and
// sparse selections, including one naming only dropped pages); every other page gets what it
// gets without the drop. Ranges add up (two adjacent ones drop the page across them) and a page
// only partly dropped keeps its gradients; on the device tier and with most pages on the host.
void CheckDroppedGradients(const Target& target) {
  const int64_t T = 28;  // pages 0..6 of 4 tokens
  OwnedKvPools reference_pools = MakeTiers(16, 0, target), device_pools = MakeTiers(16, 0, target),
               tiered_pools = MakeTiers(2, 16, target);
  SequenceKvCache reference(reference_pools.pools(), 1), device(device_pools.pools(), 1),
      tiered(tiered_pools.pools(), 1);
  const at::Tensor k = Random({T, kShape.kv_heads, kShape.head_dim}, 800, target);
  for (SequenceKvCache* c : {&reference, &device, &tiered}) ASSERT_TRUE(c->Append(0, k, k * 2).ok());
  for (SequenceKvCache* c : {&device, &tiered}) {
    c->DropGradients(8, 10);
    c->DropGradients(10, 16);  // with the call before: pages 2 and 3
    c->DropGradients(17, 24);  // page 4 only partly (kept), page 5 whole
    EXPECT_EQ(c->GradPagesKept(T), 4);
  }
  const at::Tensor dk = Random({kShape.kv_heads, T - 2, kShape.head_dim}, 801, target);
  const at::Tensor dv = Random({kShape.kv_heads, T - 2, kShape.head_dim}, 802, target);
  // Pages 0..6 with repeats and -1; then only dropped pages.
  const at::Tensor selection =
      at::tensor({0, 2, 3, -1, 5, 1, 6, 4, 2, -1, 6, 0}, at::kLong).view({3, 2, 2}).to(target.device);
  const at::Tensor only_dropped = at::tensor({2, 3, 5, -1}, at::kLong).view({1, 2, 2}).to(target.device);
  const auto page_grads = [&](const at::Tensor& sel, uint64_t seed) {
    const std::vector<int64_t> sizes = {sel.size(0), kShape.kv_heads, sel.size(2) * kShape.page_tokens,
                                        kShape.head_dim};
    return std::pair{Random(sizes, seed, target), Random(sizes, seed + 1, target)};
  };
  const auto [pk, pv] = page_grads(selection, 803);
  const auto [ok, ov] = page_grads(only_dropped, 805);
  for (SequenceKvCache* c : {&reference, &device, &tiered}) {
    ASSERT_TRUE(c->AccumulateGrad(0, 1, dk, dv).ok());
    ASSERT_TRUE(c->AccumulatePageGrad(0, selection, selection.cpu().to(at::kInt), pk, pv).ok());
    ASSERT_TRUE(c->PrefetchPages(0, only_dropped.cpu(), /*with_grads=*/true).ok());
    ASSERT_TRUE(c->AccumulatePageGrad(0, only_dropped, only_dropped.cpu(), ok, ov).ok());
  }
  EXPECT_EQ(reference.grad_pages_allocated(), 7);
  auto [want_k, want_v] = reference.ReadGrad(0, 0, T);
  for (at::Tensor* w : {&want_k, &want_v}) {
    *w = w->clone();
    w->slice(0, 8, 16).zero_();
    w->slice(0, 20, 24).zero_();
  }
  const double tolerance = target.device.is_cuda() ? 1e-6 : 0;
  for (SequenceKvCache* c : {&device, &tiered}) {
    const std::string what = c == &device ? "device" : "tiered";
    EXPECT_EQ(c->grad_pages_allocated(), 4) << what;
    auto [got_k, got_v] = c->ReadGrad(0, 0, T);
    ExpectSame(got_k, want_k, "dK " + what, tolerance);
    ExpectSame(got_v, want_v, "dV " + what, tolerance);
  }
  EXPECT_GT(tiered_pools.grad_host->stats().used_pages, 0);
}

TEST(HostTierTest, DroppedGradientsAreNeitherAllocatedNorAdded) { CheckDroppedGradients(kCpu); }

TEST(HostTierGpuTest, DroppedGradientsAreNeitherAllocatedNorAdded) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  CheckDroppedGradients(kCuda);
}

// A gradient page goes where its KV page is while that pool has room, else to the other tier;
// with both full, the allocation fails (and says so).
TEST(HostTierTest, GradientPagesFollowTheirKvPages) {
  const int64_t T = 8 * kShape.page_tokens;
  auto owned = MakeKvPools(kShape, kCpu.dtype, kCpu.dtype, kCpu.device,
                           KvPoolSizes{.device_kv = 3, .device_grad = 2, .host_kv = 5, .host_grad = 3},
                           /*host_slab_bytes=*/5 * kShape.elems() * 8);
  ASSERT_TRUE(owned.ok()) << owned.status();
  SequenceKvCache cache(owned->pools(), 1);
  ASSERT_TRUE(cache
                  .Append(0, Random({T, kShape.kv_heads, kShape.head_dim}, 900),
                          Random({T, kShape.kv_heads, kShape.head_dim}, 901))
                  .ok());
  ASSERT_EQ(owned->kv->stats().used_pages, 3);  // KV pages 0..2 on the device, 3..7 on the host
  const auto select = [&](std::vector<int64_t> pages) {
    const auto n = static_cast<int64_t>(pages.size());
    const at::Tensor selection = at::tensor(pages, at::kLong).view({1, 1, n}).expand({1, kShape.kv_heads, n});
    const std::vector<int64_t> sizes = {1, kShape.kv_heads, n * kShape.page_tokens, kShape.head_dim};
    return cache.AccumulatePageGrad(0, selection, selection, Random(sizes, 902), Random(sizes, 903));
  };
  using Used = std::pair<int64_t, int64_t>;  // gradient pages on the device, on the host
  const auto used = [&] { return Used{owned->grad->stats().used_pages, owned->grad_host->stats().used_pages}; };
  ASSERT_TRUE(select({6, 7}).ok());
  EXPECT_EQ(used(), Used(0, 2)) << "host KV pages: host gradient pages";
  ASSERT_TRUE(select({0}).ok());
  EXPECT_EQ(used(), Used(1, 2)) << "a device KV page: a device gradient page";
  ASSERT_TRUE(select({1, 2}).ok());
  EXPECT_EQ(used(), Used(2, 3)) << "the device full: page 2's on the host";
  const absl::Status full = select({5});
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(cache.grad_pages_allocated(), 5);
}

// The copy engine moves a batch as runs of adjacent slots (of some heads of each page, packed)
// and counts every byte, each way. On a
// GPU (pinned slabs) a batch of several runs is one copy kernel's launch, a batch of one run a
// cudaMemcpyAsync: both are here, each way.
void CheckBatchesRoundTrip(const Target& target) {
  const int64_t page_bytes = kShape.elems() * at::elementSize(target.dtype);
  auto pool = PagePool::CreateHost(PageKind::kKv, kShape, target.dtype, 8, /*pinned=*/target.device.is_cuda(),
                                   /*slab_bytes=*/4 * page_bytes);
  std::vector<PageId> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(*pool->Allocate());
  CopyEngine copies{target.device};
  std::vector<std::pair<TransferDirection, int64_t>> seen;
  copies.set_observer([&](TransferDirection d, PageKind kind, int64_t bytes, double seconds) {
    EXPECT_EQ(kind, PageKind::kKv);
    EXPECT_GE(seconds, 0);
    seen.emplace_back(d, bytes);
  });
  // Out of order and across slabs: three runs.
  const std::vector<PageId> order = {ids[5], ids[0], ids[1], ids[2], ids[4]};
  const at::Tensor images = Random({5, 2, kShape.kv_heads, kShape.page_tokens, kShape.head_dim}, 9, target);
  copies.WritePages(*pool, order, images);
  copies.Fence();
  for (int i = 0; i < 5; ++i) ExpectSame(pool->Page(order[i]), images[i].cpu(), "host page " + std::to_string(i));
  ExpectSame(copies.FetchPages(*pool, order), images, "fetched");
  auto pending = copies.StartFetch(*pool, {ids[2], ids[0]});
  ExpectSame(copies.Await(pending), at::stack({images[3], images[1]}), "prefetched");
  ExpectSame(copies.FetchPages(*pool, {ids[1], ids[2]}), images.slice(0, 2, 4), "one run");
  copies.Fence();
  EXPECT_EQ(copies.bytes_to_host(), 5 * page_bytes);
  EXPECT_EQ(copies.bytes_to_device(), 9 * page_bytes);
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0], std::make_pair(TransferDirection::kDeviceToHost, 5 * page_bytes));
  EXPECT_EQ(seen[2], std::make_pair(TransferDirection::kHostToDevice, 2 * page_bytes));
  // Some heads of each page (sparse attention's fetches): packed, one image per (page, head), in
  // order of page and then head, and only they counted.
  const std::vector<uint64_t> heads = {2, 3, 1};
  const at::Tensor some = copies.FetchPages(*pool, {ids[5], ids[1], ids[0]}, &heads);
  ExpectSame(
      some, at::stack({images[0].select(1, 1), images[2].select(1, 0), images[2].select(1, 1), images[1].select(1, 0)}),
      "some heads");
  copies.Fence();  // its duration reported while `seen` lives
  EXPECT_EQ(copies.bytes_to_device(), 9 * page_bytes + 4 * page_bytes / kShape.kv_heads);
  ASSERT_EQ(seen.size(), 5u);
  EXPECT_EQ(seen[4], std::make_pair(TransferDirection::kHostToDevice, 4 * page_bytes / kShape.kv_heads));
}

TEST(CopyEngineTest, BatchesRoundTripAndAreCounted) { CheckBatchesRoundTrip(kCpu); }

// Of page images [n, 2, kv_heads, page_tokens, head_dim], the heads set in heads[i] of image i,
// packed one [2, page_tokens, head_dim] per (page, head) as AddToPages takes them.
at::Tensor PackHeads(const at::Tensor& images, const std::vector<uint64_t>& heads) {
  std::vector<at::Tensor> packed;
  for (size_t i = 0; i < heads.size(); ++i) {
    for (int64_t h = 0; h < images.size(2); ++h) {
      if ((heads[i] >> h & 1) != 0) packed.push_back(images[static_cast<int64_t>(i)].select(1, h));
    }
  }
  return at::stack(packed).contiguous();
}

// AddToPages adds the K and V of the given heads of each image into host pages (bfloat16 pages:
// in float32, rounded as torch rounds), leaves the other heads as they were, counts the bytes
// of the heads sent, and a fetch queued right after (no fence) sees every sum. On a GPU the
// device adds: the heads' rows come in, are added to and go back (counted both ways); on the
// CPU the host adds.
void CheckAdditions(const Target& target) {
  for (const at::ScalarType dtype : {target.dtype, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const int64_t page_bytes = kShape.elems() * at::elementSize(dtype);
    auto pool = PagePool::CreateHost(PageKind::kKvGrad, kShape, dtype, 8, /*pinned=*/target.device.is_cuda(),
                                     /*slab_bytes=*/4 * page_bytes);
    std::vector<PageId> ids;
    for (int i = 0; i < 5; ++i) ids.push_back(*pool->Allocate());
    CopyEngine copies{target.device};
    const std::vector<int64_t> shape = {5, 2, kShape.kv_heads, kShape.page_tokens, kShape.head_dim};
    const at::Tensor base = Random(shape, 21, target).to(dtype), images = Random(shape, 22, target).to(dtype);
    const at::Tensor more = Random(shape, 23, target).to(dtype).slice(0, 0, 1);
    copies.WritePages(*pool, ids, base);
    const std::vector<uint64_t> heads = {1, 2, 3, 0, 1};  // page 3: no head
    copies.AddToPages(*pool, ids, heads, PackHeads(images, heads));
    copies.AddToPages(*pool, {ids[0]}, {3}, PackHeads(more, {3}));  // page 0 again, both heads
    const at::Tensor got = copies.FetchPages(*pool, ids).cpu();
    at::Tensor want = base.cpu().clone();
    const auto add = [&](int64_t i, uint64_t mask, const at::Tensor& x) {
      for (int64_t h = 0; h < kShape.kv_heads; ++h) {
        if ((mask >> h & 1) == 0) continue;
        at::Tensor w = want[i].select(1, h);
        const at::ScalarType sum = dtype == at::kBFloat16 ? at::kFloat : dtype;
        w.copy_((w.to(sum) + x.cpu().select(1, h).to(sum)).to(dtype));
      }
    };
    for (int64_t i = 0; i < 5; ++i) add(i, heads[i], images[i]);
    add(0, 3, more[0]);
    ExpectSame(got, want, "pages after additions");
    const int64_t head_bytes = page_bytes / (2 * kShape.kv_heads);
    const int64_t added = (1 + 1 + 2 + 0 + 1 + 2) * 2 * head_bytes;
    EXPECT_EQ(copies.bytes_to_host(), 5 * page_bytes + added);
    EXPECT_EQ(copies.bytes_to_device(), 5 * page_bytes + (target.device.is_cuda() ? added : 0));
  }
}

TEST(CopyEngineTest, AdditionsLandInTheSelectedHeads) { CheckAdditions(kCpu); }

TEST(CopyEngineGpuTest, AdditionsLandInTheSelectedHeads) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  CheckAdditions(kCuda);
}

TEST(CopyEngineGpuTest, BatchesRoundTripAndAreCounted) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  CheckBatchesRoundTrip(kCuda);
}

std::unique_ptr<Transformer> LoraModel(at::ScalarType dtype = at::kDouble, at::Device device = at::kCPU) {
  auto model = Transformer::Random(testing::TinyLlamaConfig(), dtype, device, /*seed=*/3, /*init_std=*/0.2);
  LoraOptions lora;
  lora.rank = 4;
  EXPECT_TRUE(model->AddLora(lora, 5).ok());
  testing::RandomizeLoraB(*model, 13);
  return model;
}

TokenSequence SeventyTokens() {
  std::vector<int64_t> ids;
  for (int i = 0; i < 70; ++i) ids.push_back((i * 37 + 11) % 61);
  return TokenSequence::FromDocument(ids);
}

// A whole training step with most pages in the host tier gives the same loss and gradients as
// with every page on the device, dense and sparse; the host tier was used both ways. On the
// CPU bit for bit. On a GPU within `tolerance`: there the copies run on their own streams,
// beside the computation, ordered by events only (a copy that overtook a write, or a buffer
// reused before its copy landed, would show as garbage), and sparse stage 1 overlaps its two
// chunks' fetches with their computation.
void CheckTrainingStep(const Target& target, double tolerance) {
  for (const bool sparse : {false, true}) {
    SCOPED_TRACE(sparse ? "sparse" : "dense");
    const TokenSequence seq = SeventyTokens();
    const double scale = 1.0 / static_cast<double>(seq.label_tokens());
    ChunkTrainerOptions options;
    options.chunk_tokens = 8;
    if (sparse) options.sparse = kernels::PageSelectOptions{.page_budget = 3, .sink_pages = 1, .local_pages = 1};
    const int64_t pages = 2 * (70 / kShape.page_tokens + 2);

    auto model = LoraModel(target.dtype, target.device);
    OwnedKvPools device_only = MakeTiers(pages, 0, target);
    ChunkTrainer reference(model.get(), device_only.pools(), options);
    auto want_loss = reference.TrainSequence(seq, scale, 1);
    ASSERT_TRUE(want_loss.ok()) << want_loss.status();
    const Grads want = TakeGrads(*model);

    OwnedKvPools tiered = MakeTiers(6, pages, target);
    ChunkTrainer trainer(model.get(), tiered.pools(), options);
    auto loss = trainer.TrainSequence(seq, scale, 1);
    ASSERT_TRUE(loss.ok()) << loss.status();
    if (tolerance == 0) {
      EXPECT_EQ(loss->loss_sum, want_loss->loss_sum);
    } else {
      EXPECT_NEAR(loss->loss_sum, want_loss->loss_sum, tolerance * std::abs(want_loss->loss_sum));
    }
    const Grads got = TakeGrads(*model);
    for (const auto& [name, g] : want) ExpectSame(got.at(name), g, name, tolerance);
    EXPECT_GT(trainer.memory().host_kv_peak_bytes, 0);
    EXPECT_GT(trainer.memory().bytes_to_device, 0);
    EXPECT_GT(trainer.memory().bytes_to_host, 0);
    EXPECT_EQ(tiered.kv_host->stats().used_pages, 0);
  }
}

TEST(HostTierTest, TrainingStepEqualsTheDeviceOnlyStep) { CheckTrainingStep(kCpu, 0); }

// float32 on the GPU: the two runs may sum in different orders (index-add), not more.
TEST(HostTierGpuTest, TrainingStepEqualsTheDeviceOnlyStep) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  CheckTrainingStep(kCuda, 1e-5);
}

// Counts LibTorch's warnings of calls that wait for the device (its synchronisation debug
// mode): reads of device values, blocking copies, stream synchronisations. Waits on CUDA events,
// which the trainer and the copy engine make on purpose, are not among them.
class DeviceWaits : public c10::WarningHandler {
 public:
  DeviceWaits() : previous_(c10::WarningUtils::get_warning_handler()) {
    c10::WarningUtils::set_warning_handler(this);
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
  }
  ~DeviceWaits() override {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    c10::WarningUtils::set_warning_handler(previous_);
  }
  void process(const c10::Warning& warning) override {
    if (warning.msg().find("synchroniz") != std::string::npos) ++count_;
  }
  int count() const { return count_; }

 private:
  c10::WarningHandler* previous_;
  int count_ = 0;
};

// A training step on the GPU in bfloat16 (the fused attention path), dense and sparse, with
// pages on both tiers, waits for the device once: to read the loss at its end. No step of
// either stage drains the device's queue while the host prepares the next work (a document
// start or a label read back, a blocking upload, a stream synchronised), which would leave the
// device idle meanwhile.
TEST(HostTierGpuTest, TrainingStepWaitsForTheDeviceOnlyForItsLoss) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Target bf16{at::Device(at::kCUDA, 0), at::kBFloat16};
  for (const bool sparse : {false, true}) {
    SCOPED_TRACE(sparse ? "sparse" : "dense");
    const TokenSequence seq = SeventyTokens();
    ChunkTrainerOptions options;
    options.chunk_tokens = 8;
    if (sparse) options.sparse = kernels::PageSelectOptions{.page_budget = 3, .sink_pages = 1, .local_pages = 1};
    auto model = LoraModel(bf16.dtype, bf16.device);
    OwnedKvPools tiered = MakeTiers(6, 2 * (70 / kShape.page_tokens + 2), bf16, at::kFloat);
    ChunkTrainer trainer(model.get(), tiered.pools(), options);
    ASSERT_TRUE(trainer.TrainSequence(seq, 0.01, 1).ok());  // first use: cuDNN plans, allocations
    int waits = 0;
    {
      DeviceWaits counter;
      auto loss = trainer.TrainSequence(seq, 0.01, 1);
      waits = counter.count();
      ASSERT_TRUE(loss.ok()) << loss.status();
    }
    EXPECT_EQ(waits, 1);
    EXPECT_GT(trainer.memory().bytes_to_device, 0);
  }
}

// memory.kv_grad_dtype: bfloat16 gradient pages (accumulated in float32, stored rounded after
// each chunk's contribution) against float32 pages, float32 model: the LoRA gradients move by
// the rounding and no more, and the host tier stores the same bf16 pages bit for bit.
TEST(KvGradDtypeTest, Bfloat16PagesChangeTheGradientsByTheirRoundingOnly) {
  const TokenSequence seq = SeventyTokens();
  const double scale = 1.0 / static_cast<double>(seq.label_tokens());
  ChunkTrainerOptions options;
  options.chunk_tokens = 8;
  const int64_t pages = 2 * (70 / kShape.page_tokens + 2);
  const Target f32{at::Device(at::kCPU), at::kFloat};
  auto model = LoraModel(at::kFloat);
  const auto train = [&](const OwnedKvPools& tiers) {
    ChunkTrainer trainer(model.get(), tiers.pools(), options);
    EXPECT_TRUE(trainer.TrainSequence(seq, scale, 1).ok());
    return TakeGrads(*model);
  };
  const Grads want = train(MakeTiers(pages, 0, f32));
  const Grads bf16 = train(MakeTiers(pages, 0, f32, at::kBFloat16));
  const Grads bf16_host = train(MakeTiers(6, pages, f32, at::kBFloat16));
  std::string worst;
  const double error = testing::MaxRelativeError(bf16, want, &worst);
  std::cout << "bfloat16 gradient pages: largest relative error of a LoRA gradient " << error << " (" << worst << ")\n";
  EXPECT_GT(error, 1e-6);  // the pages were bf16
  EXPECT_LT(error, 2e-2);  // and only rounded
  for (const auto& [name, g] : bf16) ExpectSame(bf16_host.at(name), g, name);
}

}  // namespace
}  // namespace oomb
