// The page table of one sequence: for each layer, the KV page of each run of `page_tokens`
// tokens, and the KV-gradient page of each (invalid until the page's first contribution), plus
// the pages whose gradients are never read (SpaCO). Metadata only, torch-free: the data lives in
// the pools (worker/kv), which the KV store (worker/kv/kv_store.h) drives from this table.
//
// Plan, then commit (llama.cpp's memory interface): an append is planned (how many pages it
// needs; nothing changes), the store allocates them, and the plan is committed with their ids.
// Tables are append-only per layer, truncated from the end only by ReleaseFrom, in reverse
// chunk order.
//
// Sliding windows (PastReach): a layer whose queries see only the last `window` keys keeps, of
// its full pages, only those a later chunk's attention reads (PageReachable); ReleaseUnreachable
// takes the others out as soon as they are full, leaving invalid ids in their place. A chunk
// starting at token s reads its past from s - window + 1 on, in both stages, so the pages kept
// are those within window - 1 tokens before a chunk start: about (window + page_tokens) /
// chunk_tokens of the layer's pages, and no gradient page is ever made for the others.
//
// Thread-safety: none; one table per sequence, used by one training thread.
#ifndef OOMB_WORKER_PAGING_PAGE_TABLE_H_
#define OOMB_WORKER_PAGING_PAGE_TABLE_H_

#include <cstdint>
#include <vector>

#include "worker/paging/page_id.h"

namespace oomb {

// Which past tokens the attention of a layer's later chunks reads: all of them (window 0), or,
// with chunks of chunk_tokens tokens (from token 0), those within window - 1 tokens before the
// start of a later chunk.
struct PastReach {
  std::vector<int64_t> windows;  // per layer; empty: every layer attends its whole past
  int64_t chunk_tokens = 0;
};

// Whether a later chunk reads any token of page `page` (tokens [page * page_tokens, (page + 1) *
// page_tokens)) of a layer with a sliding window of `window` tokens (0: none): the first chunk
// start after the page's first token, s, is at most window - 1 tokens past the page's last token
// (a window of 1 reads no past).
bool PageReachable(int64_t page, int64_t page_tokens, int64_t window, int64_t chunk_tokens);

// The pages a layer holds once `tokens` tokens were appended: its reachable full pages and a
// part-full last one (all ceil(tokens / page_tokens) of them without a window).
int64_t PagesKept(int64_t tokens, int64_t page_tokens, int64_t window, int64_t chunk_tokens);

// The tokens of a `tokens`-token sequence in chunks of `chunk_tokens` that precede its last
// chunk: the only ones a later chunk reads (dense attention appends no KV for the last chunk,
// and no chunk adds gradients to it).
int64_t TokensBeforeLastChunk(int64_t tokens, int64_t chunk_tokens);

// The most KV pages the table of a `tokens`-token sequence holds at once, in its `num_layers`
// layers together: each layer's PagesKept + 1, and, with sliding windows, one chunk's pages
// more (no more than a layer releases), which an append holds before the unread ones go.
int64_t SequencePagesBound(int64_t tokens, int64_t page_tokens, const PastReach& reach, int64_t num_layers);

class PageTable {
 public:
  PageTable(int64_t num_layers, int64_t page_tokens, PastReach reach = {});

  int64_t num_layers() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t page_tokens() const { return page_tokens_; }
  // Tokens appended to the layer so far.
  int64_t tokens(int64_t layer) const { return tokens_[layer]; }
  // The layer's KV pages, one per `page_tokens` tokens (the last one possibly part full).
  const std::vector<PageId>& kv_pages(int64_t layer) const { return kv_[layer]; }
  // The layer's gradient pages, one per KV page (invalid where none).
  const std::vector<PageId>& grad_pages(int64_t layer) const { return grad_[layer]; }

  // The pages holding tokens [begin, end): indices [first, last).
  struct Range {
    int64_t first = 0, last = 0;
    int64_t size() const { return last - first; }
  };
  Range PagesOf(int64_t begin, int64_t end) const;

  // Appending `n` tokens to `layer`: the new pages it needs (`new_pages`, indices from
  // `first_new`) and whether the first token starts a page. Changes nothing.
  struct AppendPlan {
    int64_t layer = 0;
    int64_t n = 0;
    int64_t first_new = 0;
    int64_t new_pages = 0;
    bool page_aligned = false;
  };
  AppendPlan PlanAppend(int64_t layer, int64_t n) const;
  // Records the plan's pages (exactly plan.new_pages ids) and tokens.
  void CommitAppend(const AppendPlan& plan, const std::vector<PageId>& new_pages);

  // Of the layer's pages [first, last) (or of `pages`), those that need a gradient page: none
  // yet, and their gradients not dropped. Pages past the layer's last, and released ones, are
  // left out.
  std::vector<int64_t> MissingGradPages(int64_t layer, Range pages) const;
  std::vector<int64_t> MissingGradPages(int64_t layer, const std::vector<int64_t>& pages) const;
  void SetGradPage(int64_t layer, int64_t page, PageId id);
  // The layer's gradient pages among those of tokens [begin, end) that exist, and (optional)
  // their positions in the range's pages.
  std::vector<PageId> GradPagesIn(int64_t layer, int64_t begin, int64_t end, std::vector<int64_t>* pos) const;

  // Removes, in every layer, the KV and gradient pages whose first token is >= `token`, and
  // returns them (the caller frees them); every layer then holds at most `token` tokens.
  struct Released {
    std::vector<PageId> kv, grad;
  };
  Released ReleaseFrom(int64_t token);

  // Takes out of `layer` its full pages that no later chunk reads (PastReach) and returns them
  // (the caller frees them); none for a layer without a window.
  Released ReleaseUnreachable(int64_t layer);

  // SpaCO: the gradients of tokens [begin, end) will never be read. A page all of whose tokens
  // are such never gets a gradient page (MissingGradPages leaves it out). Calls add up.
  void DropGradients(int64_t begin, int64_t end);
  bool GradDropped(int64_t page) const {
    return page < static_cast<int64_t>(page_grad_dropped_.size()) && page_grad_dropped_[page];
  }
  // Of the pages of tokens [0, tokens), how many keep their gradients (in each layer).
  int64_t GradPagesKept(int64_t tokens) const;
  int64_t grad_pages_allocated() const;

 private:
  bool NeedsGradPage(int64_t layer, int64_t page) const;

  int64_t page_tokens_;
  PastReach reach_;
  std::vector<int64_t> checked_;           // [layer]: pages before it were checked by ReleaseUnreachable
  std::vector<std::vector<PageId>> kv_;    // [layer][page]; invalid where released
  std::vector<std::vector<PageId>> grad_;  // [layer][page]; invalid until first use
  std::vector<int64_t> tokens_;
  std::vector<bool> token_grad_dropped_;  // DropGradients, per token
  std::vector<bool> page_grad_dropped_;   // per page: every token of it dropped
};

}  // namespace oomb

#endif  // OOMB_WORKER_PAGING_PAGE_TABLE_H_
