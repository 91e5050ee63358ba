// The copy engine (worker/kv/copy_engine.h): batched page copies each way, some heads of a
// page packed, additions into host pages, every byte counted.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <string>
#include <utility>
#include <vector>

#include "tests/worker/kv/kv_testing.h"
#include "worker/kv/copy_engine.h"
#include "worker/kv/page_pool.h"

namespace oomb {
namespace {

using namespace testing;  // NOLINT(build/namespaces): the KV tests' shared helpers

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

}  // namespace
}  // namespace oomb
