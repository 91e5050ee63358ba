// Page summaries and the page selection of sparse attention (docs/ARCHITECTURE.md §5).
//
// The past of a chunk is whole pages of P tokens (sparse mode requires memory.chunk_tokens to
// be a multiple of memory.page_tokens, so a chunk starts on a page boundary): n_past = S / P
// pages before the chunk's first token S. The chunk's C queries are cut into tiles of P rows
// (the last tile may be shorter): n_tiles = ceil(C / P).
//
// Summaries, one per page and KV head, kept for the pages written so far:
//   mean_key:  the mean of the page's keys                      [n_pages, kv_heads, D]
//   min_max:   element-wise min and max of its keys (Quest)     [n_pages, 2, kv_heads, D]
// (index 0 = min, 1 = max), in the dtype of the keys given.
//
// Selection, per query tile t and KV head h, shared by the G query heads of h (GQA): the score
// of past page p is, summed over the tile's queries i and the group's heads g,
//   mean_key:  q_{i,g} . mean_{p,h}
//   min_max:   sum_d max(q_{i,g,d} * min_{p,h,d}, q_{i,g,d} * max_{p,h,d})
//              (Quest's upper bound of q . k over the page; summed over the tile it is
//              Q+ . max + Q- . min, with Q+ and Q- the sums of the positive and the negative
//              parts of the queries, so it costs two small matmuls, not one per query).
// The first `sink_pages` pages and the `local_pages` pages just before the chunk are always
// selected; the rest of `page_budget` goes to the highest scores. A page no query of the tile
// may see (wholly before the tile's earliest document start, with packing) is never selected.
// The result is int64 [n_tiles, kv_heads, min(n_past, page_budget)]: page indices in
// ascending order, -1 in the leading entries where fewer pages are visible. With
// page_budget >= n_past every visible page is selected, and sparse attention is dense.
//
// Scores are computed in float32 (float64 for float64 queries). The trainer makes the
// selection once per chunk and layer in stage 1 and reuses it in stage 2, so recomputation
// never depends on the selection being reproducible.
#ifndef OOMB_KERNELS_TORCH_PAGE_SELECT_H_
#define OOMB_KERNELS_TORCH_PAGE_SELECT_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace oomb::kernels {

enum class PageSummary { kMeanKey, kMinMax };

struct PageSelectOptions {
  int64_t page_tokens = 128;  // P
  int64_t page_budget = 64;   // pages attended per query tile and KV head, sink and local included
  int64_t sink_pages = 1;     // the sequence's first pages, always attended
  int64_t local_pages = 4;    // the pages just before the chunk, always attended
  PageSummary summary = PageSummary::kMeanKey;
};

// Summaries of the pages holding `keys` [n, kv_heads, D] (n tokens starting on a page
// boundary; a last partial page is summarised over the tokens it has):
// [ceil(n / P), kv_heads, D] or [ceil(n / P), 2, kv_heads, D].
at::Tensor SummarizePages(const at::Tensor& keys, int64_t page_tokens, PageSummary summary);

// The selection of a chunk whose first token is `past_tokens` (a multiple of P):
//   q:          [C, num_heads, D]   after RoPE
//   summaries:  the summaries of pages [0, past_tokens / P), as SummarizePages returns them
//   doc_start:  [C] int64           global index of each query's document start
// Returns int64 [n_tiles, kv_heads, min(n_past, page_budget)] on q's device (see above).
// Raises c10::Error for mismatched shapes or options, naming the argument.
at::Tensor SelectPages(const at::Tensor& q, const at::Tensor& summaries, const at::Tensor& doc_start,
                       int64_t past_tokens, const PageSelectOptions& options);

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_TORCH_PAGE_SELECT_H_
