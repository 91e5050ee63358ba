// The KV store (worker/kv/kv_store.h): every operation gives bit-identical results whichever
// tier a page lives on (device pages first, the rest on the host), SpaCO's dropped gradients,
// and gradient pages placed beside their KV pages.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <string>
#include <utility>
#include <vector>

#include "tests/worker/kv/kv_testing.h"
#include "worker/kv/copy_engine.h"
#include "worker/kv/kv_store.h"

namespace oomb {
namespace {

using namespace testing;  // NOLINT(build/namespaces): the KV tests' shared helpers

// The two caches of CheckEveryCacheOperation: `a` on the device only, `b` over a device pool of
// 5 pages and the host.
struct TwoStores {
  static constexpr int64_t kLayers = 2, kChunk = 6, kChunks = 5, kTokens = kChunk * kChunks;
  explicit TwoStores(const Target& t)
      : target(t),
        device_only(MakeTiers(kLayers * (kTokens / kShape.page_tokens + 1), 0, t)),
        tiered(MakeTiers(5, kLayers * (kTokens / kShape.page_tokens + 1), t)),
        a(device_only.pools(), kLayers),
        b(tiered.pools(), kLayers) {}
  Target target;
  OwnedKvPools device_only, tiered;
  KvStore a, b;
};

// Appends the chunks to both, and reads ranges that straddle the tiers, prefetched and not.
void CheckAppendsAndReads(TwoStores& s) {
  const Target& target = s.target;
  KvStore &a = s.a, &b = s.b;
  const int64_t layers = s.kLayers, chunk = s.kChunk, T = s.kTokens;
  for (int64_t i = 0; i < s.kChunks; ++i) {
    for (int64_t l = 0; l < layers; ++l) {
      const at::Tensor k = Random({chunk, kShape.kv_heads, kShape.head_dim}, 100 + 10 * i + l, target);
      const at::Tensor v = Random({chunk, kShape.kv_heads, kShape.head_dim}, 200 + 10 * i + l, target);
      ASSERT_TRUE(a.Append(l, k, v).ok());
      ASSERT_TRUE(b.Append(l, k, v).ok());
    }
  }
  EXPECT_EQ(s.tiered.kv->stats().used_pages, 5);
  EXPECT_GT(s.tiered.kv_host->stats().used_pages, 0);
  EXPECT_EQ(s.tiered.kv->stats().used_pages + s.tiered.kv_host->stats().used_pages,
            s.device_only.kv->stats().used_pages);

  for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{{0, T}, {3, 17}, {13, 29}, {20, 21}}) {
    for (int64_t l = 0; l < layers; ++l) {
      const std::string what =
          "layer " + std::to_string(l) + " [" + std::to_string(begin) + ", " + std::to_string(end) + ")";
      auto [ka, va] = Ok(a.Read(l, begin, end));
      ASSERT_TRUE(b.Prefetch(l, begin, end).ok());
      auto [kb, vb] = Ok(b.Read(l, begin, end));
      ExpectSame(kb, ka, "K " + what);
      ExpectSame(vb, va, "V " + what);
      auto [kc, vc] = Ok(b.Read(l, begin, end));  // no prefetch
      ExpectSame(kc, ka, "K again " + what);
    }
  }
}

// Gradients accumulated into ranges and read back.
void CheckGradients(TwoStores& s) {
  const Target& target = s.target;
  KvStore &a = s.a, &b = s.b;
  for (int64_t l = 0; l < s.kLayers; ++l) {
    // A prefetch of gradient pages [0, 24) that a write to some of them overtakes: it must be
    // dropped, not used stale by the later accumulation into exactly those pages.
    ASSERT_TRUE(b.Prefetch(l, 0, 24, /*with_grads=*/true).ok());
    for (const auto& [begin, n] : std::vector<std::pair<int64_t, int64_t>>{{5, 11}, {0, 24}, {0, 8}}) {
      const at::Tensor dk = Random({kShape.kv_heads, n, kShape.head_dim}, 300 + begin + l, target);
      const at::Tensor dv = Random({kShape.kv_heads, n, kShape.head_dim}, 400 + begin + l, target);
      ASSERT_TRUE(a.AccumulateGrad(l, begin, dk, dv).ok());
      ASSERT_TRUE(b.AccumulateGrad(l, begin, dk, dv).ok());
    }
    auto [ga, gva] = Ok(a.ReadGrad(l, 0, s.kTokens));
    auto [gb, gvb] = Ok(b.ReadGrad(l, 0, s.kTokens));
    ExpectSame(gb, ga, "dK layer " + std::to_string(l));
    ExpectSame(gvb, gva, "dV layer " + std::to_string(l));
  }
}

// Sparse: selections over the 7 full pages of a layer, with repeats and -1.
at::Tensor Selection(const Target& target) {
  return at::tensor({0, 6, 3, -1, 2, 2, 5, 1, 4, -1, 6, 0}, at::kLong).view({3, 2, 2}).to(target.device);
}

void CheckGathersStartedEarly(TwoStores& s) {
  KvStore &a = s.a, &b = s.b;
  OwnedKvPools& tiered = s.tiered;
  const at::Tensor selection = Selection(s.target);
  const at::Tensor host_selection = selection.cpu().to(at::kInt);
  {
    // Two gathers started at once (stage 1's two chunks in flight), collected in the other
    // order: each collects its own fetch, and nothing more comes over. One handed to another
    // layer's gather is left alone, and that gather fetches for itself.
    KvStore::PagesInFlight started[2] = {Ok(b.StartGather(0, host_selection)), Ok(b.StartGather(1, host_selection))};
    EXPECT_NE(started[0].fetch, nullptr);
    EXPECT_NE(started[1].fetch, nullptr);
    const int64_t fetched = tiered.copies->bytes_to_device();
    for (const int64_t l : {1, 0}) {
      auto [ka, va] = Ok(a.GatherPages(l, selection, host_selection));
      auto [kb, vb] = Ok(b.GatherPages(l, selection, host_selection, &started[l]));
      ExpectSame(kb, ka, "K, gather started early");
      ExpectSame(vb, va, "V, gather started early");
      EXPECT_EQ(started[l].fetch, nullptr);
    }
    EXPECT_EQ(tiered.copies->bytes_to_device(), fetched);
    KvStore::PagesInFlight other = Ok(b.StartGather(0, host_selection));
    ExpectSame(Ok(b.GatherPages(1, selection, host_selection, &other)).first,
               Ok(a.GatherPages(1, selection, host_selection)).first, "K, another layer's gather handed in");
    EXPECT_NE(other.fetch, nullptr);
    EXPECT_GT(tiered.copies->bytes_to_device(), fetched);
  }
}

// Sparse gathers and page gradients, prefetched and not, and a prefetch overtaken by a write.
void CheckGathersAndPageGradients(TwoStores& s) {
  const Target& target = s.target;
  KvStore &a = s.a, &b = s.b;
  OwnedKvPools& tiered = s.tiered;
  const at::Tensor selection = Selection(target);
  const at::Tensor host_selection = selection.cpu().to(at::kInt);
  for (int64_t l = 0; l < s.kLayers; ++l) {
    // Layer 0 prefetched (pages and their gradients), layer 1 not.
    if (l == 0) {
      ASSERT_TRUE(b.PrefetchPages(l, host_selection, /*with_grads=*/true).ok());
    }
    auto [ka, va] = Ok(a.GatherPages(l, selection, host_selection));
    const int64_t fetched_before = tiered.copies->bytes_to_device();
    auto [kb, vb] = Ok(b.GatherPages(l, selection, host_selection));
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
    auto [ga, gva] = Ok(a.ReadGrad(l, 0, s.kTokens));
    auto [gb, gvb] = Ok(b.ReadGrad(l, 0, s.kTokens));
    const double tolerance = target.device.is_cuda() ? 1e-6 : 0;
    ExpectSame(gb, ga, "dK after page gradients", tolerance);
    ExpectSame(gvb, gva, "dV after page gradients", tolerance);
  }
  EXPECT_GT(tiered.copies->bytes_to_device(), 0);
  EXPECT_GT(tiered.copies->bytes_to_host(), 0);
}

// Release in reverse chunk order: what is left reads the same, and at the end no page is used.
void CheckRelease(TwoStores& s) {
  for (int64_t i = s.kChunks - 1; i >= 0; --i) {
    s.a.ReleaseFrom(i * s.kChunk);
    s.b.ReleaseFrom(i * s.kChunk);
    for (int64_t l = 0; l < s.kLayers; ++l) {
      if (i == 0) continue;
      ExpectSame(Ok(s.b.Read(l, 0, i * s.kChunk)).first, Ok(s.a.Read(l, 0, i * s.kChunk)).first, "after release");
    }
  }
  const OwnedKvPools& tiered = s.tiered;
  for (const PagePool* p : {tiered.kv.get(), tiered.grad.get(), tiered.kv_host.get(), tiered.grad_host.get()}) {
    EXPECT_EQ(p->stats().used_pages, 0);
  }
}

// Every cache operation, through both caches, on the same inputs: chunks of 6 tokens over pages
// of 4 (so host pages are also written partly, twice), reads of ranges that straddle the tiers,
// prefetched and not, gradients accumulated and read back, sparse gathers and page gradients
// (prefetched and not, and a prefetch overtaken by a write), and release in reverse chunk order.
void CheckEveryCacheOperation(const Target& target) {
  TwoStores s(target);
  for (void (*step)(TwoStores&) :
       {CheckAppendsAndReads, CheckGradients, CheckGathersStartedEarly, CheckGathersAndPageGradients, CheckRelease}) {
    step(s);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(KvStoreTest, EveryOperationEqualsTheDeviceOnlyStore) { CheckEveryCacheOperation(kCpu); }

// The same on a GPU with pinned host slabs and the copy engine's streams and events (gpu
// label: skipped without a device). Index-add accumulation into gathered pages on the GPU
// adds repeated pages in an unspecified order, so page gradients of a selection with repeats
// may differ in the last bit: everything else is compared bit for bit.
TEST(KvStoreGpuTest, EveryOperationEqualsTheDeviceOnlyStore) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  CheckEveryCacheOperation(kCuda);
}

// KvStore::DropGradients (SpaCO): a page all of whose tokens are dropped gets no
// gradient page and keeps nothing AccumulateGrad and AccumulatePageGrad add (dense ranges and
// sparse selections, including one naming only dropped pages); every other page gets what it
// gets without the drop. Ranges add up (two adjacent ones drop the page across them) and a page
// only partly dropped keeps its gradients; on the device tier and with most pages on the host.
void CheckDroppedGradients(const Target& target) {
  const int64_t T = 28;  // pages 0..6 of 4 tokens
  OwnedKvPools reference_pools = MakeTiers(16, 0, target), device_pools = MakeTiers(16, 0, target),
               tiered_pools = MakeTiers(2, 16, target);
  KvStore reference(reference_pools.pools(), 1), device(device_pools.pools(), 1), tiered(tiered_pools.pools(), 1);
  const at::Tensor k = Random({T, kShape.kv_heads, kShape.head_dim}, 800, target);
  for (KvStore* c : {&reference, &device, &tiered}) ASSERT_TRUE(c->Append(0, k, k * 2).ok());
  for (KvStore* c : {&device, &tiered}) {
    c->DropGradients(8, 10);
    c->DropGradients(10, 16);  // with the call before: pages 2 and 3
    c->DropGradients(17, 24);  // page 4 only partly (kept), page 5 whole
    EXPECT_EQ(c->table().GradPagesKept(T), 4);
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
  for (KvStore* c : {&reference, &device, &tiered}) {
    ASSERT_TRUE(c->AccumulateGrad(0, 1, dk, dv).ok());
    ASSERT_TRUE(c->AccumulatePageGrad(0, selection, selection.cpu().to(at::kInt), pk, pv).ok());
    ASSERT_TRUE(c->PrefetchPages(0, only_dropped.cpu(), /*with_grads=*/true).ok());
    ASSERT_TRUE(c->AccumulatePageGrad(0, only_dropped, only_dropped.cpu(), ok, ov).ok());
  }
  EXPECT_EQ(reference.table().grad_pages_allocated(), 7);
  auto [want_k, want_v] = Ok(reference.ReadGrad(0, 0, T));
  for (at::Tensor* w : {&want_k, &want_v}) {
    *w = w->clone();
    w->slice(0, 8, 16).zero_();
    w->slice(0, 20, 24).zero_();
  }
  const double tolerance = target.device.is_cuda() ? 1e-6 : 0;
  for (KvStore* c : {&device, &tiered}) {
    const std::string what = c == &device ? "device" : "tiered";
    EXPECT_EQ(c->table().grad_pages_allocated(), 4) << what;
    auto [got_k, got_v] = Ok(c->ReadGrad(0, 0, T));
    ExpectSame(got_k, want_k, "dK " + what, tolerance);
    ExpectSame(got_v, want_v, "dV " + what, tolerance);
  }
  EXPECT_GT(tiered_pools.grad_host->stats().used_pages, 0);
}

TEST(KvStoreTest, DroppedGradientsAreNeitherAllocatedNorAdded) { CheckDroppedGradients(kCpu); }

TEST(KvStoreGpuTest, DroppedGradientsAreNeitherAllocatedNorAdded) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  CheckDroppedGradients(kCuda);
}

// A gradient page goes where its KV page is while that pool has room, else to the other tier;
// with both full, the allocation fails (and says so).
TEST(KvStoreTest, GradientPagesFollowTheirKvPages) {
  const int64_t T = 8 * kShape.page_tokens;
  auto owned = MakeKvPools(kShape, kCpu.dtype, kCpu.dtype, kCpu.device,
                           KvPoolSizes{.device_kv = 3, .device_grad = 2, .host_kv = 5, .host_grad = 3},
                           /*host_slab_bytes=*/5 * kShape.elems() * 8);
  ASSERT_TRUE(owned.ok()) << owned.status();
  KvStore cache(owned->pools(), 1);
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
  EXPECT_EQ(cache.table().grad_pages_allocated(), 5);
}

}  // namespace
}  // namespace oomb
