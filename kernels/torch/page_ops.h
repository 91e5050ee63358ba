// LibTorch binding of kernels/page_copy.h: validates tensors, picks the CPU reference or the
// CUDA kernel by device, launches on the current stream.
//
//   arena: [num_slots, 2, kv_heads, page_tokens, head_dim]
//   slots: [num_pages] int32, on the arena's device
//   k, v:  [kv_heads, num_pages * page_tokens, head_dim], contiguous, arena's dtype and device
//
// Bad arguments raise c10::Error (TORCH_CHECK) naming the argument; callers at component
// boundaries turn that into a status.
#ifndef OOMB_KERNELS_TORCH_PAGE_OPS_H_
#define OOMB_KERNELS_TORCH_PAGE_OPS_H_

#include <ATen/core/Tensor.h>

#include <utility>

namespace oomb::kernels {

// Returns (k, v) gathered from the slots.
std::pair<at::Tensor, at::Tensor> GatherPages(const at::Tensor& arena, const at::Tensor& slots);
// Writes k, v into the slots (distinct).
void ScatterPages(at::Tensor& arena, const at::Tensor& slots, const at::Tensor& k, const at::Tensor& v);
// arena[slots] += (k, v); arena float32 or float64 (CPU), k, v of the arena's dtype.
void ScatterAddPages(at::Tensor& arena, const at::Tensor& slots, const at::Tensor& k, const at::Tensor& v);

// Sparse attention's page copies (kernels/selected_pages.h), per (query tile, KV head):
//   slots:      [num_pages] int32, the slot of each past page, on the arena's device
//   selection:  [n_tiles, kv_heads, n] int64 page indices (-1: none), on the arena's device
//   k, v:       [n_tiles, kv_heads, n * page_tokens, head_dim]
// CUDA runs the kernels (bfloat16 or float32 arenas and buffers); the CPU, and CUDA for other
// dtypes, run the reference, ATen's index_select / index_add_, which the GPU tests compare
// against.
//
// Returns the selected pages' (k, v), zeros where -1, in the arena's dtype. `second`, when
// defined: more images, packed one per (page, KV head), [m, 2, page_tokens, head_dim] (the
// arena's dtype and device); slots are then int32 of the selection's shape, the slot of each
// entry's page, s < 0 naming second[-s - 1]: sparse attention's host pages, only their
// selecting heads fetched (CopyEngine::StartFetch), read beside the device's arena without
// first copying both into one tensor.
std::pair<at::Tensor, at::Tensor> GatherSelectedPages(const at::Tensor& arena, const at::Tensor& slots,
                                                      const at::Tensor& selection, const at::Tensor& second = {});
// Adds (k, v) into the selected pages (-1 skipped; a page selected by several tiles gets every
// contribution): summed per page in float32 (float64 for a float64 arena), then added to the
// page once, rounded to its dtype. `second`, when defined, as GatherSelectedPages' (slots per
// entry): each of its images some entry names is set to that (page, head)'s sum, the others
// left as they are; sparse backward's host gradient pages, summed on the device for the copy
// engine to add into the host (CopyEngine::AddToPages), in the same kernel as the arena's.
void AccumulateSelectedPages(at::Tensor& arena, const at::Tensor& slots, const at::Tensor& selection,
                             const at::Tensor& k, const at::Tensor& v, const at::Tensor& second = {});

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_TORCH_PAGE_OPS_H_
