// Host page pools: slabs allocated in the background, pages handed out zeroed and distinct,
// gradient pages zeroed on the pool's own thread once freed.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <chrono>
#include <thread>
#include <vector>

#include "tests/worker/kv/kv_testing.h"
#include "worker/kv/page_pool.h"

namespace oomb {
namespace {

using namespace testing;  // NOLINT(build/namespaces): the KV tests' shared helpers

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

}  // namespace
}  // namespace oomb
