// The page table (worker/paging/page_table.h), torch-free: appends planned then committed, page
// ranges, gradient pages allocated once and only where kept, SpaCO's drops adding up, and
// release from a token in every layer, and sliding-window layers keeping only the pages later
// chunks read.
#include "worker/paging/page_table.h"

#include <gtest/gtest.h>

#include <vector>

namespace oomb {
namespace {

std::vector<PageId> Slots(Tier tier, std::vector<uint32_t> slots) {
  std::vector<PageId> ids;
  for (const uint32_t s : slots) ids.emplace_back(tier, s);
  return ids;
}

// Appends of 6 tokens over pages of 4: the first starts a page and needs two, the second ends
// inside the second page's room and needs one more, and the plan changes nothing until
// committed.
TEST(PageTableTest, AppendsArePlannedThenCommitted) {
  PageTable table(/*num_layers=*/2, /*page_tokens=*/4);
  const PageTable::AppendPlan first = table.PlanAppend(0, 6);
  EXPECT_EQ(first.first_new, 0);
  EXPECT_EQ(first.new_pages, 2);
  EXPECT_TRUE(first.page_aligned);
  EXPECT_EQ(table.tokens(0), 0) << "a plan changes nothing";
  table.CommitAppend(first, Slots(Tier::kDevice, {7, 3}));
  EXPECT_EQ(table.tokens(0), 6);
  EXPECT_EQ(table.tokens(1), 0) << "layers are independent";

  const PageTable::AppendPlan second = table.PlanAppend(0, 6);
  EXPECT_EQ(second.first_new, 2);
  EXPECT_EQ(second.new_pages, 1);
  EXPECT_FALSE(second.page_aligned);
  table.CommitAppend(second, Slots(Tier::kHost, {0}));
  EXPECT_EQ(table.tokens(0), 12);
  const std::vector<PageId> want = {PageId(Tier::kDevice, 7), PageId(Tier::kDevice, 3), PageId(Tier::kHost, 0)};
  EXPECT_EQ(table.kv_pages(0), want);
  EXPECT_EQ(table.grad_pages(0).size(), 3u);
  for (const PageId& id : table.grad_pages(0)) EXPECT_FALSE(id.valid()) << "no gradient page before one is set";

  const PageTable::Range r = table.PagesOf(3, 9);
  EXPECT_EQ(r.first, 0);
  EXPECT_EQ(r.last, 3);
  EXPECT_EQ(table.PagesOf(4, 8).size(), 1);
}

// A page needs a gradient page until it has one; GradPagesIn returns those set in a range with
// their positions in it; pages past the layer's last are never asked for.
TEST(PageTableTest, GradientPagesAreMissingUntilSet) {
  PageTable table(1, 4);
  table.CommitAppend(table.PlanAppend(0, 16), Slots(Tier::kDevice, {0, 1, 2, 3}));
  EXPECT_EQ(table.MissingGradPages(0, PageTable::Range{1, 6}), (std::vector<int64_t>{1, 2, 3}));
  table.SetGradPage(0, 2, PageId(Tier::kHost, 9));
  EXPECT_EQ(table.MissingGradPages(0, std::vector<int64_t>{0, 2, 3, 5}), (std::vector<int64_t>{0, 3}));
  std::vector<int64_t> pos;
  EXPECT_EQ(table.GradPagesIn(0, 4, 16, &pos), std::vector<PageId>{PageId(Tier::kHost, 9)});
  EXPECT_EQ(pos, std::vector<int64_t>{1});
  EXPECT_EQ(table.grad_pages_allocated(), 1);
}

// DropGradients: calls add up (two adjacent ranges drop the page across them); a page only partly
// dropped keeps its gradients; a dropped page is never missing a gradient page.
TEST(PageTableTest, DroppedGradientsAddUpPerPage) {
  PageTable table(1, 4);
  table.CommitAppend(table.PlanAppend(0, 28), Slots(Tier::kDevice, {0, 1, 2, 3, 4, 5, 6}));
  table.DropGradients(8, 10);
  EXPECT_FALSE(table.GradDropped(2)) << "page 2 only partly dropped so far";
  table.DropGradients(10, 16);
  table.DropGradients(17, 24);
  EXPECT_TRUE(table.GradDropped(2));
  EXPECT_TRUE(table.GradDropped(3));
  EXPECT_FALSE(table.GradDropped(4)) << "token 16 is kept";
  EXPECT_TRUE(table.GradDropped(5));
  EXPECT_FALSE(table.GradDropped(6));
  EXPECT_EQ(table.GradPagesKept(28), 4);
  EXPECT_EQ(table.MissingGradPages(0, PageTable::Range{0, 7}), (std::vector<int64_t>{0, 1, 4, 6}));
}

// ReleaseFrom(token) removes, in every layer, the pages whose first token is >= token (a page
// holding tokens on both sides stays), returns the valid ones of each kind, and truncates the
// token counts.
TEST(PageTableTest, ReleaseFromRemovesTheLaterPagesOfEveryLayer) {
  PageTable table(2, 4);
  table.CommitAppend(table.PlanAppend(0, 10), Slots(Tier::kDevice, {0, 1, 2}));
  table.CommitAppend(table.PlanAppend(1, 10), Slots(Tier::kHost, {0, 1, 2}));
  table.SetGradPage(0, 2, PageId(Tier::kDevice, 40));
  table.SetGradPage(1, 0, PageId(Tier::kDevice, 41));
  const PageTable::Released released = table.ReleaseFrom(6);
  EXPECT_EQ(released.kv, (std::vector<PageId>{PageId(Tier::kDevice, 2), PageId(Tier::kHost, 2)}));
  EXPECT_EQ(released.grad, std::vector<PageId>{PageId(Tier::kDevice, 40)});
  for (int64_t layer = 0; layer < 2; ++layer) {
    EXPECT_EQ(table.kv_pages(layer).size(), 2u);
    EXPECT_EQ(table.tokens(layer), 6);
  }
  EXPECT_EQ(table.grad_pages_allocated(), 1);
  const PageTable::Released rest = table.ReleaseFrom(0);
  EXPECT_EQ(rest.kv.size(), 4u);
  EXPECT_EQ(rest.grad.size(), 1u);
  EXPECT_EQ(table.tokens(0), 0);
}

// PageReachable against its definition: some token t of the page is seen by the first query
// of a later chunk, s - window < t < s, for every page, window and chunk size (windows below,
// at and above the page and chunk sizes, none their multiples or all).
TEST(PageTableTest, PageReachableIsWhatLaterChunksRead) {
  for (const int64_t P : {1, 3, 8}) {
    for (const int64_t C : {1, 5, 8, 13, 32}) {
      for (const int64_t W : {1, 2, 7, 8, 11, 40}) {
        for (int64_t p = 0; p < 30; ++p) {
          bool read = false;
          for (int64_t s = C; s <= (p + 1) * P + W + C; s += C) {
            for (int64_t t = p * P; t < (p + 1) * P; ++t) read |= s - W < t && t < s;
          }
          EXPECT_EQ(PageReachable(p, P, W, C), read) << "page " << p << " P " << P << " C " << C << " W " << W;
        }
      }
    }
  }
  EXPECT_TRUE(PageReachable(0, 4, /*window=*/0, 8));  // no window: every page
}

// A layer with a window of 5, chunks of 8, pages of 2: after each chunk's append, the full
// pages no later chunk reads are taken out (invalid ids stay in their place) and get no
// gradient page; the other layer keeps all. ReleaseFrom then frees what is left.
TEST(PageTableTest, SlidingWindowLayersReleaseWhatNoLaterChunkReads) {
  PageTable table(2, 2, PastReach{.windows = {5, 0}, .chunk_tokens = 8});
  uint32_t slot = 0;
  std::vector<PageId> released;
  for (int chunk = 0; chunk < 3; ++chunk) {
    for (int64_t layer = 0; layer < 2; ++layer) {
      const PageTable::AppendPlan plan = table.PlanAppend(layer, 8);
      std::vector<PageId> ids;
      for (int64_t i = 0; i < plan.new_pages; ++i) ids.emplace_back(Tier::kDevice, slot++);
      table.CommitAppend(plan, ids);
      const PageTable::Released r = table.ReleaseUnreachable(layer);
      if (layer == 1) {
        EXPECT_TRUE(r.kv.empty());
      }
      released.insert(released.end(), r.kv.begin(), r.kv.end());
    }
  }
  // Chunk starts 8 and 16 read tokens 4..7 and 12..15 (pages 2, 3 and 6, 7); a chunk at 24
  // would read pages 10, 11. Pages 0, 1, 4, 5, 8, 9 of layer 0 went.
  std::vector<bool> valid;
  for (const PageId& id : table.kv_pages(0)) valid.push_back(id.valid());
  EXPECT_EQ(valid, (std::vector<bool>{false, false, true, true, false, false, true, true, false, false, true, true}));
  EXPECT_EQ(released.size(), 6u);
  EXPECT_EQ(PagesKept(24, 2, 5, 8), 6);
  EXPECT_EQ(PagesKept(24, 2, 0, 8), 12);
  EXPECT_EQ(table.MissingGradPages(0, PageTable::Range{0, 12}), (std::vector<int64_t>{2, 3, 6, 7, 10, 11}));
  EXPECT_EQ(table.MissingGradPages(1, PageTable::Range{0, 12}).size(), 12u);
  const PageTable::Released rest = table.ReleaseFrom(0);
  EXPECT_EQ(rest.kv.size(), 6u + 12u);
}

// The tokens before the last chunk: every full chunk but the last, for any length.
TEST(PageTableTest, TokensBeforeLastChunk) {
  EXPECT_EQ(TokensBeforeLastChunk(0, 16), 0);
  EXPECT_EQ(TokensBeforeLastChunk(1, 16), 0);
  EXPECT_EQ(TokensBeforeLastChunk(16, 16), 0);
  EXPECT_EQ(TokensBeforeLastChunk(17, 16), 16);
  EXPECT_EQ(TokensBeforeLastChunk(40, 9), 36);
  EXPECT_EQ(TokensBeforeLastChunk(48, 16), 32);
}

}  // namespace
}  // namespace oomb
