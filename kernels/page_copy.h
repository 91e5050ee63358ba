// Batched page copies between a page arena and contiguous per-head buffers.
//
// A KV page holds `page_tokens` tokens of one layer: K and V for every KV head. An arena is a
// preallocated array of page slots:
//
//   arena: [num_slots, 2, kv_heads, page_tokens, head_dim]   (index 0 of dim 1 is K, 1 is V)
//
// A layer's past is a list of slots (its row of the page table). Gathering the list gives the
// past as contiguous per-head tensors, the layout attention reads:
//
//   k, v:  [kv_heads, num_pages * page_tokens, head_dim]
//
// Scatter is the inverse (writes the buffers into the slots). ScatterAdd adds float32 buffers
// into float32 slots (the KV-gradient store's accumulation). One launch moves every page of the
// list: no per-page cudaMemcpyAsync, which is several times slower than one bulk copy.
//
// The launchers take plain pointers and sizes (no torch types); kernels/torch/page_ops.h is the
// binding that validates tensors. kernels/reference/page_copy_ref.h has the CPU
// implementation with the same contract: the test oracle and the CPU path.
#ifndef OOMB_KERNELS_PAGE_COPY_H_
#define OOMB_KERNELS_PAGE_COPY_H_

#include <cstdint>
#include <vector>

#include "kernels/cuda_types.h"

namespace oomb::kernels {

struct PageCopyParams {
  void* arena = nullptr;           // [num_slots, 2, kv_heads, page_tokens, head_dim]
  const int32_t* slots = nullptr;  // [num_pages]: arena slot of page i (device memory for CUDA)
  void* k = nullptr;               // [kv_heads, num_pages * page_tokens, head_dim]
  void* v = nullptr;               // same shape as k
  int64_t num_pages = 0;
  int64_t kv_heads = 0;
  int64_t page_tokens = 0;
  int64_t head_dim = 0;
  int64_t elem_bytes = 0;  // 2 (bf16/fp16), 4 (fp32) or 8 (fp64)
};

// arena[slots] -> k, v. Requires page_tokens * head_dim * elem_bytes % 16 == 0 on CUDA.
cudaError_t LaunchPageGather(const PageCopyParams& p, cudaStream_t stream);
// k, v -> arena[slots]. Slots must be distinct.
cudaError_t LaunchPageScatter(const PageCopyParams& p, cudaStream_t stream);
// arena[slots] += k, v, all float32 (elem_bytes == 4). Slots must be distinct.
cudaError_t LaunchPageScatterAddF32(const PageCopyParams& p, cudaStream_t stream);

// One contiguous copy of a batch (the copy engine's runs of adjacent pages, worker/kv/copy_engine.h).
struct CopyRunDesc {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t bytes = 0;
};

// The most bytes one descriptor of LaunchCopyRuns moves: what a thread block loads at once
// (512 threads, four 16-byte vectors each); one KV head's K (or V) of a Qwen2.5-7B page.
inline constexpr int64_t kCopySegmentBytes = int64_t{32} << 10;

// `runs` cut into descriptors of at most kCopySegmentBytes each, in order: what LaunchCopyRuns
// takes.
std::vector<CopyRunDesc> CopySegments(const std::vector<CopyRunDesc>& runs);

// Copies every run of a batch in one launch: runs[i].bytes from runs[i].src to runs[i].dst.
// Either side may be pinned host memory, which the kernel's threads read or write through
// unified addressing (PCIe): a batch of scattered host pages moves in one launch, not in one
// slow cudaMemcpyAsync per page. `runs`: `num_runs` descriptors in device memory
// (CopySegments'), each of at most kCopySegmentBytes; every address and size a multiple of 16;
// runs do not overlap. `blocks`: how many thread blocks (so SMs, at most) the copy occupies
// while it runs; block b copies descriptors b, b + blocks, ..., two at a time (64 KiB in
// flight a block, enough over 8 blocks to cover PCIe's latency).
cudaError_t LaunchCopyRuns(const CopyRunDesc* runs, int64_t num_runs, int blocks, cudaStream_t stream);

// The element types LaunchAddRuns adds.
enum class AddType { kBFloat16, kFloat32, kFloat64 };

// As LaunchCopyRuns, but adds: runs[i].dst += runs[i].src, elementwise in `type` (bfloat16:
// summed in float32 and rounded to nearest even once, as torch adds bfloat16 tensors). The copy
// engine adds page gradients into pinned host pages this way (dst on the host, read and
// written through unified addressing, src on the device), with no host thread and no staging.
cudaError_t LaunchAddRuns(const CopyRunDesc* runs, int64_t num_runs, AddType type, int blocks, cudaStream_t stream);

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_PAGE_COPY_H_
