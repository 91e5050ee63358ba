// Page copies for sparse attention: the pages a selection names, gathered per (query tile, KV
// head), and their gradients added back into the pages.
//
// Layouts (kernels/page_copy.h for the arena):
//   arena:      [num_slots, 2, kv_heads, page_tokens, head_dim]   (dim 1: 0 = K, 1 = V)
//   slots:      [num_pages] int32: the arena slot of past page i
//   second:     optional: more images, packed one per (page, KV head), [m, 2, page_tokens,
//               head_dim] of the arena's dtype; slots are then [entries], the slot of each
//               selection entry's page, s < 0 naming second[-s - 1] (a host page's selecting
//               heads: fetched for a gather, worker/kv/copy_engine.h StartFetch; or summed
//               for an accumulation, to be added into the host page by the copy engine)
//   selection:  [n_tiles, kv_heads, n] int64: page indices, -1 = none
//   k, v:       [n_tiles, kv_heads, n * page_tokens, head_dim]: entry e = (t * kv_heads + h) * n + i
//               of the selection owns the run k[e * page_tokens * head_dim ...] of one page and head
//
// Gather writes each entry's run from its page (zeros for -1): one pass over the bytes, where
// index_select + masked_fill would make three.
//
// Accumulate adds dK / dV into the pages' runs without atomics: the entries are sorted
// beforehand by a key naming the run they add into (`order`, `sorted_key`: the entries in that
// order and their keys; -1 entries share a key, which the kernel skips); the thread blocks of a
// run's first entry sum the run's contributions in float32 registers and add them into the page
// once, in its storage type (float32 or bfloat16: rounded once per call). An image of `second`
// is set to its sum instead (every image some entry names; the others are left as they are).
//
// The launchers take plain pointers (no torch types); kernels/torch/page_ops.h is the binding
// that validates tensors, sorts the entries, and has the CPU reference (ATen ops).
#ifndef OOMB_KERNELS_SELECTED_PAGES_H_
#define OOMB_KERNELS_SELECTED_PAGES_H_

#include <cstdint>

#include "kernels/cuda_types.h"

namespace oomb::kernels {

enum class PageDtype { kBFloat16, kFloat32 };

struct SelectedPagesParams {
  void* arena = nullptr;                // arena_dtype
  void* second = nullptr;               // packed images (arena_dtype), slot s < 0 its image -s - 1
  const int32_t* slots = nullptr;       // [num_pages], or [entries] with `second`
  const int64_t* selection = nullptr;   // [entries], -1 = none (gather)
  const int64_t* order = nullptr;       // [entries] (accumulate)
  const int64_t* sorted_key = nullptr;  // [entries] (accumulate)
  void* k = nullptr;                    // [entries, page_tokens * head_dim], buffer_dtype
  void* v = nullptr;
  int64_t entries = 0;  // n_tiles * kv_heads * n
  int64_t n = 0;        // pages per (tile, head)
  int64_t num_pages = 0;
  int64_t kv_heads = 0;
  int64_t page_tokens = 0;
  int64_t head_dim = 0;
  PageDtype arena_dtype = PageDtype::kBFloat16;
  PageDtype buffer_dtype = PageDtype::kBFloat16;
};

// k, v <- the selected pages (arena, second and buffers of one dtype; with `second`, a slot per
// entry, a negative one reading `second`). page_tokens * head_dim % 8 == 0.
cudaError_t LaunchGatherSelectedPages(const SelectedPagesParams& p, cudaStream_t stream);
// pages += k, v (any mix of the two dtypes), each run summed in float32 first; with `second`,
// its images named = their sums.
cudaError_t LaunchAccumulateSelectedPages(const SelectedPagesParams& p, cudaStream_t stream);

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_SELECTED_PAGES_H_
