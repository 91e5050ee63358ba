#include "worker/paging/page_table.h"

#include <algorithm>
#include <cassert>
#include <map>
#include <utility>

namespace oomb {

bool PageReachable(int64_t page, int64_t page_tokens, int64_t window, int64_t chunk_tokens) {
  if (window <= 0 || chunk_tokens <= 0) return true;
  if (window == 1) return false;  // a query sees itself only
  const int64_t next_start = (page * page_tokens / chunk_tokens + 1) * chunk_tokens;
  return next_start <= (page + 1) * page_tokens - 1 + window - 1;
}

int64_t PagesKept(int64_t tokens, int64_t page_tokens, int64_t window, int64_t chunk_tokens) {
  const int64_t full = tokens / page_tokens;
  int64_t kept = tokens % page_tokens != 0 ? 1 : 0;
  if (window <= 0 || chunk_tokens <= 0) return full + kept;
  for (int64_t p = 0; p < full; ++p) kept += PageReachable(p, page_tokens, window, chunk_tokens) ? 1 : 0;
  return kept;
}

int64_t TokensBeforeLastChunk(int64_t tokens, int64_t chunk_tokens) {
  return tokens <= 0 ? 0 : (tokens - 1) / chunk_tokens * chunk_tokens;
}

int64_t SequencePagesBound(int64_t tokens, int64_t page_tokens, const PastReach& reach, int64_t num_layers) {
  const int64_t all = (tokens + page_tokens - 1) / page_tokens;
  const int64_t chunk = reach.chunk_tokens > 0 ? std::min(tokens, reach.chunk_tokens) : tokens;
  std::map<int64_t, int64_t> layers_of;  // window -> layers
  for (int64_t l = 0; l < num_layers; ++l) {
    ++layers_of[l < static_cast<int64_t>(reach.windows.size()) ? reach.windows[l] : 0];
  }
  int64_t pages = 0, transient = 0;
  for (const auto& [window, layers] : layers_of) {
    const int64_t kept = PagesKept(tokens, page_tokens, window, reach.chunk_tokens);
    pages += layers * (kept + 1);
    transient = std::max(transient, std::min((chunk + page_tokens - 1) / page_tokens + 1, all - kept));
  }
  return pages + transient;
}

PageTable::PageTable(int64_t num_layers, int64_t page_tokens, PastReach reach)
    : page_tokens_(page_tokens),
      reach_(std::move(reach)),
      checked_(num_layers, 0),
      kv_(num_layers),
      grad_(num_layers),
      tokens_(num_layers, 0) {}

PageTable::Range PageTable::PagesOf(int64_t begin, int64_t end) const {
  return {begin / page_tokens_, (end + page_tokens_ - 1) / page_tokens_};
}

PageTable::AppendPlan PageTable::PlanAppend(int64_t layer, int64_t n) const {
  AppendPlan plan;
  plan.layer = layer;
  plan.n = n;
  plan.first_new = static_cast<int64_t>(kv_[layer].size());
  plan.new_pages = (tokens_[layer] + n + page_tokens_ - 1) / page_tokens_ - plan.first_new;
  plan.page_aligned = tokens_[layer] % page_tokens_ == 0;
  return plan;
}

void PageTable::CommitAppend(const AppendPlan& plan, const std::vector<PageId>& new_pages) {
  assert(static_cast<int64_t>(new_pages.size()) == plan.new_pages &&
         static_cast<int64_t>(kv_[plan.layer].size()) == plan.first_new);
  kv_[plan.layer].insert(kv_[plan.layer].end(), new_pages.begin(), new_pages.end());
  grad_[plan.layer].resize(kv_[plan.layer].size());
  tokens_[plan.layer] += plan.n;
}

bool PageTable::NeedsGradPage(int64_t layer, int64_t page) const {
  return page < static_cast<int64_t>(grad_[layer].size()) && kv_[layer][page].valid() && !grad_[layer][page].valid() &&
         !GradDropped(page);
}

std::vector<int64_t> PageTable::MissingGradPages(int64_t layer, Range pages) const {
  std::vector<int64_t> out;
  for (int64_t p = pages.first; p < pages.last; ++p) {
    if (NeedsGradPage(layer, p)) out.push_back(p);
  }
  return out;
}

std::vector<int64_t> PageTable::MissingGradPages(int64_t layer, const std::vector<int64_t>& pages) const {
  std::vector<int64_t> out;
  for (const int64_t p : pages) {
    if (NeedsGradPage(layer, p)) out.push_back(p);
  }
  return out;
}

void PageTable::SetGradPage(int64_t layer, int64_t page, PageId id) {
  assert(page < static_cast<int64_t>(grad_[layer].size()));
  grad_[layer][page] = id;
}

std::vector<PageId> PageTable::GradPagesIn(int64_t layer, int64_t begin, int64_t end, std::vector<int64_t>* pos) const {
  const Range r = PagesOf(begin, end);
  const auto& pages = grad_[layer];
  std::vector<PageId> ids;
  for (int64_t p = r.first; p < std::min<int64_t>(r.last, pages.size()); ++p) {
    if (!pages[p].valid()) continue;
    ids.push_back(pages[p]);
    if (pos != nullptr) pos->push_back(p - r.first);
  }
  return ids;
}

PageTable::Released PageTable::ReleaseFrom(int64_t token) {
  const int64_t first_page = (token + page_tokens_ - 1) / page_tokens_;
  Released out;
  for (size_t layer = 0; layer < kv_.size(); ++layer) {
    for (auto* pages : {&kv_[layer], &grad_[layer]}) {
      auto& freed = pages == &kv_[layer] ? out.kv : out.grad;
      while (static_cast<int64_t>(pages->size()) > first_page) {
        if (pages->back().valid()) freed.push_back(pages->back());
        pages->pop_back();
      }
    }
    tokens_[layer] = std::min(tokens_[layer], token);
    checked_[layer] = std::min<int64_t>(checked_[layer], kv_[layer].size());
  }
  return out;
}

PageTable::Released PageTable::ReleaseUnreachable(int64_t layer) {
  Released out;
  const int64_t window = layer < static_cast<int64_t>(reach_.windows.size()) ? reach_.windows[layer] : 0;
  if (window <= 0) return out;
  const int64_t full = tokens_[layer] / page_tokens_;
  for (int64_t& p = checked_[layer]; p < full; ++p) {
    if (PageReachable(p, page_tokens_, window, reach_.chunk_tokens) || !kv_[layer][p].valid()) continue;
    out.kv.push_back(kv_[layer][p]);
    kv_[layer][p] = PageId();
    if (grad_[layer][p].valid()) out.grad.push_back(grad_[layer][p]);
    grad_[layer][p] = PageId();
  }
  return out;
}

void PageTable::DropGradients(int64_t begin, int64_t end) {
  if (begin >= end) return;
  if (static_cast<int64_t>(token_grad_dropped_.size()) < end) token_grad_dropped_.resize(end, false);
  std::fill(token_grad_dropped_.begin() + begin, token_grad_dropped_.begin() + end, true);
  const Range r = PagesOf(begin, end);
  if (static_cast<int64_t>(page_grad_dropped_.size()) < r.last) page_grad_dropped_.resize(r.last, false);
  for (int64_t p = r.first; p < r.last; ++p) {
    const int64_t page_end = (p + 1) * page_tokens_;
    page_grad_dropped_[p] = page_end <= static_cast<int64_t>(token_grad_dropped_.size()) &&
                            std::all_of(token_grad_dropped_.begin() + p * page_tokens_,
                                        token_grad_dropped_.begin() + page_end, [](bool dropped) { return dropped; });
  }
}

int64_t PageTable::GradPagesKept(int64_t tokens) const {
  int64_t kept = 0;
  for (int64_t p = 0; p < (tokens + page_tokens_ - 1) / page_tokens_; ++p) kept += GradDropped(p) ? 0 : 1;
  return kept;
}

int64_t PageTable::grad_pages_allocated() const {
  int64_t n = 0;
  for (const auto& layer : grad_) {
    for (const PageId& id : layer) n += id.valid() ? 1 : 0;
  }
  return n;
}

}  // namespace oomb
