#include "worker/paging/swap_layout.h"

#include <algorithm>
#include <cmath>

namespace oomb {
namespace {

int64_t Aligned(int64_t bytes) { return (bytes + kSwapAlign - 1) / kSwapAlign * kSwapAlign; }

}  // namespace

SwapLayout MakeSwapLayout(int64_t chunk_tokens, int64_t q_heads, int64_t head_dim, int64_t out_bytes,
                          int64_t min_key_tokens) {
  SwapLayout s;
  s.out_bytes = Aligned(chunk_tokens * q_heads * head_dim * out_bytes);
  s.record_bytes = Aligned(s.out_bytes + chunk_tokens * q_heads * std::max<int64_t>(4, out_bytes));
  s.min_key_tokens = min_key_tokens;
  return s;
}

int64_t SwapMinKeyTokens(int64_t dtype_bytes) {
  return static_cast<int64_t>(
      std::ceil(static_cast<double>(dtype_bytes) * kSwapAttentionFlopsPerSecond / (2 * kSwapPcieBytesPerSecond)));
}

int64_t SwapLayout::FirstSwappedChunk(int64_t chunks, int64_t chunk_tokens, int64_t layers,
                                      int64_t budget_bytes) const {
  const int64_t none = std::max<int64_t>(0, chunks - 1);
  if (layers <= 0) return none;
  const int64_t fit = RecordsWithin(budget_bytes) / layers;  // whole chunks the budget holds
  int64_t first = none;
  // Keys per query of chunk i, on average: i * C + C / 2, growing with i.
  while (first > 0 && none - first < fit && (first - 1) * chunk_tokens + chunk_tokens / 2 >= min_key_tokens) --first;
  return first;
}

}  // namespace oomb
