// Page selection and sparse attention on the CPU (kernels/torch/page_select.h,
// sparse_attention.h): the selection against a brute-force scoring of every query and page,
// sparse attention against float64 attention masked to the selection, and with a budget that
// covers every page, against dense attention.
#include "kernels/torch/sparse_attention.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <limits>
#include <set>

#include "kernels/torch/page_ops.h"
#include "kernels/torch/page_select.h"
#include "kernels/torch/paged_attention.h"
#include "tests/kernels/sparse_attention_check.h"

namespace oomb {
namespace {

using kernels::PageSelectOptions;
using kernels::PageSummary;

// Brute force: the selection of tile t, KV head h, scoring each page by summing over every
// query row and head of the group the per-query score (q . mean, or Quest's
// sum_d max(q_d min_d, q_d max_d)), then sink, local and the best of the rest.
std::set<int64_t> BruteForceSelection(const at::Tensor& q, const at::Tensor& k, int64_t S, int64_t t, int64_t h,
                                      const PageSelectOptions& o) {
  const int64_t P = o.page_tokens, n_past = S / P, Hkv = k.size(1), G = q.size(1) / Hkv;
  const int64_t i0 = t * P, i1 = std::min<int64_t>(q.size(0), i0 + P);
  std::vector<std::pair<double, int64_t>> scored;
  std::set<int64_t> chosen;
  for (int64_t p = 0; p < n_past; ++p) {
    if (p < o.sink_pages || p >= n_past - o.local_pages) {
      chosen.insert(p);
      continue;
    }
    const at::Tensor keys = k.slice(0, p * P, (p + 1) * P).select(1, h);  // [P, D]
    double score = 0;
    for (int64_t i = i0; i < i1; ++i) {
      for (int64_t g = 0; g < G; ++g) {
        const at::Tensor qi = q[i][h * G + g];
        if (o.summary == PageSummary::kMeanKey) {
          score += at::dot(qi, keys.mean(0)).item<double>();
        } else {
          const at::Tensor lo = std::get<0>(keys.min(0)), hi = std::get<0>(keys.max(0));
          score += at::maximum(qi * lo, qi * hi).sum().item<double>();
        }
      }
    }
    scored.push_back({-score, p});
  }
  std::sort(scored.begin(), scored.end());
  const int64_t rest = std::min<int64_t>(n_past, o.page_budget) - static_cast<int64_t>(chosen.size());
  for (int64_t i = 0; i < rest; ++i) chosen.insert(scored[i].second);
  return chosen;
}

class PageSelectTest : public ::testing::TestWithParam<PageSummary> {};

TEST_P(PageSelectTest, MatchesBruteForceScoring) {
  at::Generator gen = at::detail::createCPUGenerator(3);
  const int64_t S = 20 * 4, C = 10, Hq = 6, Hkv = 2, D = 8;
  PageSelectOptions o;
  o.page_tokens = 4;
  o.page_budget = 7;
  o.sink_pages = 1;
  o.local_pages = 2;
  o.summary = GetParam();
  // Keys with a per-page offset, so pages differ in their summaries.
  const at::Tensor k = at::randn({S, Hkv, D}, gen, at::kDouble) +
                       at::randn({S / 4, 1, Hkv, D}, gen, at::kDouble).repeat_interleave(4, 0).view({S, Hkv, D}) * 2;
  const at::Tensor q = at::randn({C, Hq, D}, gen, at::kDouble);
  const at::Tensor sel =
      kernels::SelectPages(q, kernels::SummarizePages(k, 4, GetParam()), at::zeros({C}, at::kLong), S, o);
  ASSERT_EQ(sel.sizes(), at::IntArrayRef({3, Hkv, 7}));  // tiles of 4, 4 and 2 rows
  for (int64_t t = 0; t < 3; ++t) {
    for (int64_t h = 0; h < Hkv; ++h) {
      const std::set<int64_t> want = BruteForceSelection(q, k, S, t, h, o);
      std::vector<int64_t> got(sel[t][h].data_ptr<int64_t>(), sel[t][h].data_ptr<int64_t>() + 7);
      EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
      EXPECT_EQ(std::set<int64_t>(got.begin(), got.end()), want) << "tile " << t << " head " << h;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Summaries, PageSelectTest, ::testing::Values(PageSummary::kMeanKey, PageSummary::kMinMax),
                         [](const auto& info) { return info.param == PageSummary::kMeanKey ? "mean_key" : "min_max"; });

// Pages wholly before a tile's document are never selected: fewer pages come back, -1 first.
TEST(PageSelectTest, PagesBeforeTheDocumentAreNotSelected) {
  at::Generator gen = at::detail::createCPUGenerator(4);
  const int64_t P = 4, S = 10 * P, C = 8;
  PageSelectOptions o;
  o.page_tokens = P;
  o.page_budget = 6;
  o.sink_pages = 1;
  o.local_pages = 1;
  const at::Tensor k = at::randn({S, 1, 8}, gen, at::kDouble), q = at::randn({C, 2, 8}, gen, at::kDouble);
  at::Tensor doc = at::zeros({C}, at::kLong);
  doc.slice(0, 4).fill_(27);  // tile 1's queries belong to a document that starts at token 27 (page 6)
  const at::Tensor sel = kernels::SelectPages(q, kernels::SummarizePages(k, P, PageSummary::kMeanKey), doc, S, o);
  std::vector<int64_t> tile1(sel[1][0].data_ptr<int64_t>(), sel[1][0].data_ptr<int64_t>() + 6);
  EXPECT_EQ(tile1, (std::vector<int64_t>{-1, -1, 6, 7, 8, 9}));
  EXPECT_EQ(sel[0][0].ge(0).sum().item<int64_t>(), 6);  // tile 0 sees every page
}

TEST(PageSelectTest, SummariesOfAPartialLastPage) {
  const at::Tensor k = at::arange(5 * 2, at::kDouble).view({5, 1, 2});  // 5 tokens, pages of 4
  const at::Tensor mean = kernels::SummarizePages(k, 4, PageSummary::kMeanKey);
  EXPECT_TRUE(at::allclose(mean.flatten(), at::tensor({3.0, 4.0, 8.0, 9.0}, at::kDouble)));
  const at::Tensor mm = kernels::SummarizePages(k, 4, PageSummary::kMinMax);  // [2, 2, 1, 2]
  EXPECT_TRUE(at::allclose(mm.flatten(), at::tensor({0.0, 1.0, 6.0, 7.0, 8.0, 9.0, 8.0, 9.0}, at::kDouble)));
}

struct Case {
  const char* name;
  int64_t S, C, Hq, Hkv, D, page, budget, sink, local;
  std::vector<int64_t> docs;
  PageSummary summary;
};

class SparseAttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(SparseAttentionTest, EqualsAttentionMaskedToTheSelection) {
  const Case c = GetParam();
  PageSelectOptions o;
  o.page_tokens = c.page;
  o.page_budget = c.budget;
  o.sink_pages = c.sink;
  o.local_pages = c.local;
  o.summary = c.summary;
  at::Tensor selection;
  const auto e =
      testing::CheckSparseAttention(at::kCPU, at::kDouble, c.S, c.C, c.Hq, c.Hkv, c.D, c.docs, o, 5, &selection);
  EXPECT_LE(e.max(), 1e-12) << "out " << e.out << " dq " << e.dq << " dk " << e.dk << " dv " << e.dv << " dk_past "
                            << e.dk_past << " dv_past " << e.dv_past;
  if (c.S > 0 && c.budget < c.S / c.page) {
    EXPECT_LT(selection.ge(0).sum().item<int64_t>(), selection.size(0) * selection.size(1) * (c.S / c.page));
  }
  // float32 against the same float64 reference.
  const auto f = testing::CheckSparseAttention(at::kCPU, at::kFloat, c.S, c.C, c.Hq, c.Hkv, c.D, c.docs, o, 5);
  EXPECT_LE(f.max(), 1e-5);
  // With attention sinks (gpt-oss): folded into the log-sum-exp, the sinks' gradient too.
  const auto s = testing::CheckSparseAttention(at::kCPU, at::kDouble, c.S, c.C, c.Hq, c.Hkv, c.D, c.docs, o, 5, nullptr,
                                               kernels::GpuAttentionKernel::kCudnn, /*sinks=*/true);
  EXPECT_LE(s.max(), 1e-12) << "sinks: out " << s.out << " dq " << s.dq << " dsinks " << s.dsinks;
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, SparseAttentionTest,
    ::testing::Values(Case{"sparse_mean", 96, 40, 6, 2, 8, 8, 4, 1, 1, {0}, PageSummary::kMeanKey},
                      Case{"sparse_min_max", 96, 40, 6, 2, 8, 8, 4, 1, 1, {0}, PageSummary::kMinMax},
                      Case{"sparse_packed", 96, 40, 4, 4, 8, 8, 3, 1, 0, {0, 50, 110}, PageSummary::kMeanKey},
                      Case{"no_past", 0, 21, 4, 2, 8, 4, 2, 1, 1, {0}, PageSummary::kMeanKey},
                      Case{"every_page", 64, 24, 4, 2, 8, 8, 16, 1, 2, {0}, PageSummary::kMeanKey}),
    [](const auto& info) { return std::string(info.param.name); });

// With a budget covering every page, sparse attention is dense attention (PagedAttention's
// reference, DenseAttentionReference), forward and backward, packed documents included.
TEST(SparseAttentionTest, FullBudgetEqualsDenseAttention) {
  at::Generator gen = at::detail::createCPUGenerator(8);
  const int64_t P = 4, S = 32, C = 12, T = S + C, Hq = 4, Hkv = 2, D = 8;
  const at::Tensor q = at::randn({T, Hq, D}, gen, at::kDouble), k = at::randn({T, Hkv, D}, gen, at::kDouble),
                   v = at::randn({T, Hkv, D}, gen, at::kDouble), dout = at::randn({C, Hq, D}, gen, at::kDouble);
  at::Tensor doc = at::zeros({T}, at::kLong);
  doc.slice(0, 13).fill_(13);
  const at::Tensor rq = q.clone().requires_grad_(true), rk = k.clone().requires_grad_(true),
                   rv = v.clone().requires_grad_(true);
  (kernels::DenseAttentionReference(rq, rk, rv, doc).slice(0, S) * dout).sum().backward();

  PageSelectOptions o;
  o.page_tokens = P;
  o.page_budget = S / P;
  const at::Tensor cq = q.slice(0, S).clone().requires_grad_(true), ck = k.slice(0, S).clone().requires_grad_(true),
                   cv = v.slice(0, S).clone().requires_grad_(true);
  const at::Tensor sel =
      kernels::SelectPages(cq.detach(), kernels::SummarizePages(k.slice(0, 0, S), P, o.summary), doc.slice(0, S), S, o);
  auto past = std::make_shared<testing::TensorSparsePast>(k.slice(0, 0, S).permute({1, 0, 2}).contiguous(),
                                                          v.slice(0, 0, S).permute({1, 0, 2}).contiguous(), P);
  const at::Tensor out = kernels::SparsePagedAttention(cq, ck, cv, doc.slice(0, S), past, sel, P);
  (out * dout).sum().backward();
  EXPECT_EQ(sel.ge(0).sum().item<int64_t>(), sel.size(0) * Hkv * 5);  // the visible pages 3..7, every one
  using testing::SparseRelErr;
  at::NoGradGuard no_grad;
  const at::Tensor want = kernels::DenseAttentionReference(q, k, v, doc).slice(0, S);
  EXPECT_LE(SparseRelErr(out, want), 1e-12);
  EXPECT_LE(SparseRelErr(cq.grad(), rq.grad().slice(0, S)), 1e-12);
  EXPECT_LE(SparseRelErr(ck.grad(), rk.grad().slice(0, S)), 1e-12);
  EXPECT_LE(SparseRelErr(cv.grad(), rv.grad().slice(0, S)), 1e-12);
  EXPECT_LE(SparseRelErr(past->dk_.permute({1, 0, 2}), rk.grad().slice(0, 0, S)), 1e-12);
  EXPECT_LE(SparseRelErr(past->dv_.permute({1, 0, 2}), rv.grad().slice(0, 0, S)), 1e-12);
}

// A gather from the arena and packed images of some pages' selecting heads (a host tier's
// fetch; slot -j - 1: image j) equals the gather from the arena alone (kernels_gpu_test checks
// the kernel against this).
TEST(SelectedPagesTest, TwoSourcesGatherAsOneArena) {
  const at::Tensor arena = at::randn({6, 2, 2, 4, 8}, at::kDouble);
  const at::Tensor selection = at::tensor({0, 3, 2, -1, 1, 1, 4, 0, 3, 3, 1, 2}, at::kLong).view({3, 2, 2});
  const at::Tensor slots = at::tensor({5, 0, 2, 4, 1}, at::kInt);
  auto [k, v] = kernels::GatherSelectedPages(arena, slots, selection);
  // Pages 1 and 3 (page 3 selected by head 0 only, page 1 by both) move.
  const testing::TwoSources two = testing::MoveToSecond(arena, slots, selection, {false, true, false, true, false});
  ASSERT_EQ(two.second.size(0), 3);
  auto [k2, v2] = kernels::GatherSelectedPages(arena, two.slots, selection, two.second);
  EXPECT_TRUE(at::equal(k2, k));
  EXPECT_TRUE(at::equal(v2, v));
  EXPECT_GT(k.abs().sum().item<double>(), 0.0);
  // A wrong packed image shows.
  auto [k3, v3] = kernels::GatherSelectedPages(arena, two.slots, selection, two.second.flip(0).contiguous());
  EXPECT_FALSE(at::equal(k3, k) && at::equal(v3, v));
}

// An accumulation into the arena and packed images of some pages' selecting heads (a host
// tier's gradient pages, summed on the device; slot -j - 1: image j) adds into the arena what
// the arena alone gets, but for the moved pages, and sets each image to its (page, head)'s sum
// (kernels_gpu_test checks the kernel against this).
TEST(SelectedPagesTest, TwoTargetsAccumulateAsOneArena) {
  const at::Tensor arena = at::randn({6, 2, 2, 4, 8}, at::kDouble);
  const at::Tensor selection = at::tensor({0, 3, 2, -1, 1, 1, 4, 0, 3, 3, 1, 2}, at::kLong).view({3, 2, 2});
  const at::Tensor slots = at::tensor({5, 0, 2, 4, 1}, at::kInt);
  const at::Tensor dk = at::randn({3, 2, 2 * 4, 8}, at::kDouble), dv = at::randn_like(dk);
  at::Tensor want = arena.clone(), sums = at::zeros_like(arena);
  kernels::AccumulateSelectedPages(want, slots, selection, dk, dv);
  kernels::AccumulateSelectedPages(sums, slots, selection, dk, dv);
  // Pages 1 and 3 move (page 3 selected by head 0 only, three times; page 1 by both heads).
  const std::vector<bool> moved = {false, true, false, true, false};
  const testing::TwoSources two = testing::MoveToSecond(arena, slots, selection, moved);
  at::Tensor got = arena.clone(), second = at::full_like(two.second, std::numeric_limits<double>::quiet_NaN());
  kernels::AccumulateSelectedPages(got, two.slots, selection, dk, dv, second);
  for (const int64_t page : {1, 3}) want[slots[page].item<int32_t>()].copy_(arena[slots[page].item<int32_t>()]);
  EXPECT_TRUE(at::equal(got, want));
  EXPECT_TRUE(at::equal(second, testing::MoveToSecond(sums, slots, selection, moved).second));
  EXPECT_GT(second.abs().sum().item<double>(), 0.0);
}

}  // namespace
}  // namespace oomb
