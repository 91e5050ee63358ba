// Swap instead of recompute (worker/train/attention_swap.h): how stage 1's attention results
// lie in host memory and which chunks have them, one definition for the memory planner and the
// trainer. Torch-free.
//
// A record is one chunk's result at one layer, one host allocation of its own: the attention
// output [C, q_heads, head_dim], then the log-sum-exp [q_heads, C] in float32 (float64 under a
// float64 model), each from a kSwapAlign boundary. The output's element is what the attention
// keeps (SwapOutputBytes): on a GPU the fused path's, the model's dtype; on the CPU the
// blockwise path's compute type, float32 for bfloat16 models.
//
// Which chunks: of the chunks stage 2 recomputes with a past that stage 1 read (0..N-2 of N;
// chunk N-1 runs in stage 2 only), the latest first, since their attention costs most (MEMO's
// choice), as long as
//   - the chunk's attention reads at least `min_key_tokens` keys per query on average (its past
//     plus half its own tokens): below, moving its records down and back costs more time than
//     the attention forward they save when they share the bus with KV pages (SwapMinKeyTokens;
//     0 where nothing else crosses it: the CPU, or a plan that keeps every page on the GPU,
//     whose records' copies overlap the trainer's kernels); and
//   - its records fit in the budget.
#ifndef OOMB_WORKER_PAGING_SWAP_LAYOUT_H_
#define OOMB_WORKER_PAGING_SWAP_LAYOUT_H_

#include <algorithm>
#include <cstdint>

namespace oomb {

inline constexpr int64_t kSwapAlign = 256;

// The rates SwapMinKeyTokens weighs, measured on an H100: cuDNN's fused attention forward at
// 600 TFLOP/s (the sparse-sections run in bench/results), and the records' copies at
// 40 GB/s each way beside the trainer's kernels, a lower bound of the 48-54 GB/s the copy engine
// moved them at in a 128K step (the last-chunk run in bench/results; a record is one
// contiguous block, unlike the pages' gathers).
inline constexpr double kSwapAttentionFlopsPerSecond = 6e14;
inline constexpr double kSwapPcieBytesPerSecond = 4e10;

struct SwapLayout {
  int64_t out_bytes = 0;     // the output's bytes in a record (the log-sum-exp starts here)
  int64_t record_bytes = 0;  // one record, aligned
  int64_t min_key_tokens = 0;

  // The records `budget_bytes` hold.
  int64_t RecordsWithin(int64_t budget_bytes) const { return record_bytes > 0 ? budget_bytes / record_bytes : 0; }
  // The first chunk swapped of a sequence of `chunks` chunks of `chunk_tokens` through `layers`
  // layers within `budget_bytes`: chunks [first, chunks - 1) are swapped; first == chunks - 1
  // (or 0 for an empty sequence): none.
  int64_t FirstSwappedChunk(int64_t chunks, int64_t chunk_tokens, int64_t layers, int64_t budget_bytes) const;
};

// The bytes of an element of the attention output a record holds, for a model whose dtype has
// `dtype_bytes` per element, on a GPU (`cuda`) or the CPU (see above).
inline int64_t SwapOutputBytes(int64_t dtype_bytes, bool cuda) {
  return cuda ? dtype_bytes : std::max<int64_t>(4, dtype_bytes);
}

// The layout of chunks of `chunk_tokens` for a model of `q_heads` x `head_dim` query heads whose
// attention output has `out_bytes` per element (SwapOutputBytes); `min_key_tokens` as
// SwapMinKeyTokens gives it (0: every chunk is worth swapping, as where nothing else crosses
// the bus).
SwapLayout MakeSwapLayout(int64_t chunk_tokens, int64_t q_heads, int64_t head_dim, int64_t out_bytes,
                          int64_t min_key_tokens);

// On a GPU whose KV pages cross the bus too: a record of `dtype_bytes` elements crosses it
// twice (down in stage 1, up in stage 2), 2 * C * q_heads * head_dim * dtype_bytes bytes, and
// saves an attention forward of 4 * C * q_heads * head_dim * K FLOPs over K keys per query,
// counted as if the copies held the trainer up: swapping pays when
// K >= dtype_bytes * kSwapAttentionFlopsPerSecond / (2 * kSwapPcieBytesPerSecond), whatever the
// model's shape (15,000 keys in bfloat16).
int64_t SwapMinKeyTokens(int64_t dtype_bytes);

}  // namespace oomb

#endif  // OOMB_WORKER_PAGING_SWAP_LAYOUT_H_
