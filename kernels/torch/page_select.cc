#include "kernels/torch/page_select.h"
#include "kernels/torch/matmul.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>

namespace oomb::kernels {
namespace {

at::ScalarType ScoreType(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// [n, ...] -> [ceil(n / P) * P, ...], the padding rows copies of the last row (so a padded tile
// keeps its last query's document start, and padded keys leave min / max unchanged).
at::Tensor PadRowsToPages(const at::Tensor& x, int64_t page_tokens) {
  const int64_t n = x.size(0), padded = (n + page_tokens - 1) / page_tokens * page_tokens;
  if (padded == n) return x;
  return x.index_select(0, at::arange(padded, x.options().dtype(at::kLong)).clamp_max(n - 1));
}

}  // namespace

at::Tensor SummarizePages(const at::Tensor& keys, int64_t page_tokens, PageSummary summary) {
  TORCH_CHECK(keys.dim() == 3 && keys.size(0) > 0, "keys: expected [n > 0, kv_heads, head_dim], got ", keys.sizes());
  TORCH_CHECK(page_tokens > 0, "page_tokens: must be > 0, got ", page_tokens);
  const int64_t n = keys.size(0), Hkv = keys.size(1), D = keys.size(2), P = page_tokens;
  const int64_t pages = (n + P - 1) / P;
  if (summary == PageSummary::kMeanKey) {
    // Sum over the tokens a page has, divided by their number (the last page may be partial).
    at::Tensor padded = at::zeros({pages * P, Hkv, D}, keys.options());
    padded.slice(0, 0, n).copy_(keys);
    at::Tensor counts = at::full({pages, 1, 1}, static_cast<double>(P), keys.options());
    counts[pages - 1].fill_(static_cast<double>(n - (pages - 1) * P));
    return padded.view({pages, P, Hkv, D}).sum(1) / counts;
  }
  const at::Tensor padded = PadRowsToPages(keys, P).view({pages, P, Hkv, D});
  return at::stack({std::get<0>(padded.min(1)), std::get<0>(padded.max(1))}, 1);
}

at::Tensor SelectPages(const at::Tensor& q, const at::Tensor& summaries, const at::Tensor& doc_start,
                       int64_t past_tokens, const PageSelectOptions& o) {
  TORCH_CHECK(q.dim() == 3 && q.size(0) > 0, "q: expected [C > 0, num_heads, head_dim], got ", q.sizes());
  TORCH_CHECK(o.page_tokens > 0 && past_tokens >= 0 && past_tokens % o.page_tokens == 0, "past_tokens (", past_tokens,
              ") must be a multiple of page_tokens (", o.page_tokens, ")");
  TORCH_CHECK(
      o.page_budget > 0 && o.sink_pages >= 0 && o.local_pages >= 0 && o.sink_pages + o.local_pages <= o.page_budget,
      "page selection options: need page_budget > 0 and 0 <= sink_pages + local_pages <= page_budget, got ",
      o.page_budget, ", ", o.sink_pages, ", ", o.local_pages);
  const bool min_max = o.summary == PageSummary::kMinMax;
  const int64_t C = q.size(0), Hq = q.size(1), D = q.size(2), P = o.page_tokens;
  const int64_t n_past = past_tokens / P, n_tiles = (C + P - 1) / P;
  TORCH_CHECK(summaries.dim() == (min_max ? 4 : 3) && summaries.size(0) == n_past && summaries.size(-1) == D &&
                  (!min_max || summaries.size(1) == 2) && Hq % summaries.size(-2) == 0,
              "summaries: expected ", min_max ? "[n_past, 2, kv_heads, D]" : "[n_past, kv_heads, D]", " with n_past ",
              n_past, " and D ", D, ", got ", summaries.sizes());
  TORCH_CHECK(doc_start.dim() == 1 && doc_start.size(0) == C && doc_start.scalar_type() == at::kLong,
              "doc_start: expected int64 [", C, "], got ", doc_start.sizes());
  const int64_t Hkv = summaries.size(-2), G = Hq / Hkv;
  const int64_t n_sel = std::min(n_past, o.page_budget);
  const auto long_opts = q.options().dtype(at::kLong);
  if (n_sel == 0) return at::empty({n_tiles, Hkv, 0}, long_opts);

  // Query sums of each tile and KV head: [n_tiles, Hkv, D] (padding rows are zero).
  const at::ScalarType st = ScoreType(q.scalar_type());
  at::Tensor qp = at::zeros({n_tiles * P, Hq, D}, q.options().dtype(st));
  qp.slice(0, 0, C).copy_(q);
  qp = qp.view({n_tiles, P, Hkv, G, D});
  const auto tile_sum = [](const at::Tensor& x) { return x.sum(at::IntArrayRef{1, 3}).permute({1, 0, 2}); };
  const auto scores_against = [&](const at::Tensor& qsum, const at::Tensor& summary) {  // -> [Hkv, n_tiles, n_past]
    return Matmul(qsum, summary.to(st).permute({1, 2, 0}));
  };
  at::Tensor scores;
  if (min_max) {
    scores = scores_against(tile_sum(qp.clamp_min(0)), summaries.select(1, 1)) +
             scores_against(tile_sum(qp.clamp_max(0)), summaries.select(1, 0));
  } else {
    scores = scores_against(tile_sum(qp), summaries);
  }
  scores = scores.permute({1, 0, 2}).contiguous();  // [n_tiles, Hkv, n_past]

  const double inf = std::numeric_limits<double>::infinity();
  const at::Tensor page = at::arange(n_past, long_opts);
  const at::Tensor forced = (page < o.sink_pages) | (page >= n_past - o.local_pages);
  scores.masked_fill_(forced.view({1, 1, n_past}), inf);
  // A page is visible to the tile when its last token is at or after the tile's earliest
  // document start.
  const at::Tensor tile_doc = std::get<0>(PadRowsToPages(doc_start, P).view({n_tiles, P}).min(1));
  const at::Tensor invisible = ((page + 1) * P).view({1, n_past}) <= tile_doc.view({n_tiles, 1});
  scores.masked_fill_(invisible.view({n_tiles, 1, n_past}), -inf);

  auto [values, index] = scores.topk(n_sel, -1, /*largest=*/true, /*sorted=*/false);
  index.masked_fill_(values == -inf, -1);
  return std::get<0>(index.sort(-1));
}

}  // namespace oomb::kernels
