// CUDA page gather / scatter. Contract: kernels/page_copy.h.
//
// Each (page, k|v, head) block of page_tokens * head_dim elements is contiguous both in the
// arena and in the per-head buffer, so a copy is one contiguous run per block: one CUDA block
// per run, 16-byte vector accesses across the block's threads.
#include <cstdint>

#include "kernels/page_copy.h"

namespace oomb::kernels {
namespace {

constexpr int kThreads = 256;

struct RunAddress {
  int64_t arena_offset;   // in elements
  int64_t buffer_offset;  // in elements, within k or v
  bool is_v;
};

__device__ RunAddress Locate(const PageCopyParams& p, int64_t run) {
  // run = (page * 2 + kv) * kv_heads + head
  const int64_t head = run % p.kv_heads;
  const int64_t kv = (run / p.kv_heads) % 2;
  const int64_t page = run / (2 * p.kv_heads);
  const int64_t run_elems = p.page_tokens * p.head_dim;
  const int64_t slot = p.slots[page];
  RunAddress a;
  a.arena_offset = ((slot * 2 + kv) * p.kv_heads + head) * run_elems;
  a.buffer_offset = (head * p.num_pages + page) * run_elems;
  a.is_v = kv == 1;
  return a;
}

template <bool kToArena>
__global__ void PageCopyKernel(PageCopyParams p) {
  const RunAddress a = Locate(p, blockIdx.x);
  const int64_t run_vecs = p.page_tokens * p.head_dim * p.elem_bytes / 16;
  uint4* arena = reinterpret_cast<uint4*>(static_cast<char*>(p.arena) + a.arena_offset * p.elem_bytes);
  uint4* buf = reinterpret_cast<uint4*>(static_cast<char*>(a.is_v ? p.v : p.k) + a.buffer_offset * p.elem_bytes);
  for (int64_t i = threadIdx.x; i < run_vecs; i += blockDim.x) {
    if constexpr (kToArena) {
      arena[i] = buf[i];
    } else {
      buf[i] = arena[i];
    }
  }
}

__global__ void PageScatterAddF32Kernel(PageCopyParams p) {
  const RunAddress a = Locate(p, blockIdx.x);
  const int64_t run_vecs = p.page_tokens * p.head_dim / 4;
  float4* arena = reinterpret_cast<float4*>(static_cast<float*>(p.arena) + a.arena_offset);
  const float4* buf = reinterpret_cast<const float4*>(static_cast<const float*>(a.is_v ? p.v : p.k) + a.buffer_offset);
  for (int64_t i = threadIdx.x; i < run_vecs; i += blockDim.x) {
    float4 x = arena[i];
    const float4 y = buf[i];
    x.x += y.x;
    x.y += y.y;
    x.z += y.z;
    x.w += y.w;
    arena[i] = x;
  }
}

cudaError_t CheckParams(const PageCopyParams& p) {
  if (p.num_pages < 0 || p.kv_heads <= 0 || p.page_tokens <= 0 || p.head_dim <= 0) {
    return cudaErrorInvalidValue;
  }
  if ((p.page_tokens * p.head_dim * p.elem_bytes) % 16 != 0) return cudaErrorInvalidValue;
  return cudaSuccess;
}

// The runs are cut into segments of kSegmentBytes, numbered across the batch; block b copies
// segments b, b + B, ... (B blocks), so small runs (one KV head of a page, 32 KiB) and large
// ones (many adjacent pages) spread over every block alike. In a segment, each thread loads
// kCopyUnroll 16-byte vectors before storing any: with 8 blocks, 512 KiB are in flight, enough
// to cover PCIe's latency.
constexpr int kCopyThreads = 512;
constexpr int kCopyUnroll = 8;
constexpr int64_t kSegmentBytes = int64_t{kCopyThreads} * kCopyUnroll * 16;

__global__ void CopyRunsKernel(const CopyRunDesc* runs, int64_t num_runs) {
  const int64_t blocks = gridDim.x;
  int64_t first_segment = 0;  // the batch-wide number of the run's first segment
  for (int64_t r = 0; r < num_runs; ++r) {
    const int64_t bytes = runs[r].bytes, segments = (bytes + kSegmentBytes - 1) / kSegmentBytes;
    const uint4* src = static_cast<const uint4*>(runs[r].src);
    uint4* dst = static_cast<uint4*>(runs[r].dst);
    const int64_t n = bytes / 16;
    for (int64_t s = ((blockIdx.x - first_segment) % blocks + blocks) % blocks; s < segments; s += blocks) {
      const int64_t base = s * (kSegmentBytes / 16) + threadIdx.x;
      uint4 v[kCopyUnroll];
#pragma unroll
      for (int u = 0; u < kCopyUnroll; ++u) {
        const int64_t i = base + u * kCopyThreads;
        if (i < n) v[u] = src[i];
      }
#pragma unroll
      for (int u = 0; u < kCopyUnroll; ++u) {
        const int64_t i = base + u * kCopyThreads;
        if (i < n) dst[i] = v[u];
      }
    }
    first_segment += segments;
  }
}

}  // namespace

cudaError_t LaunchCopyRuns(const CopyRunDesc* runs, int64_t num_runs, int blocks, cudaStream_t stream) {
  if (num_runs < 0 || blocks <= 0) return cudaErrorInvalidValue;
  if (num_runs == 0) return cudaSuccess;
  CopyRunsKernel<<<blocks, kCopyThreads, 0, stream>>>(runs, num_runs);
  return cudaGetLastError();
}

cudaError_t LaunchPageGather(const PageCopyParams& p, cudaStream_t stream) {
  if (cudaError_t e = CheckParams(p); e != cudaSuccess) return e;
  if (p.num_pages == 0) return cudaSuccess;
  PageCopyKernel<false><<<p.num_pages * 2 * p.kv_heads, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchPageScatter(const PageCopyParams& p, cudaStream_t stream) {
  if (cudaError_t e = CheckParams(p); e != cudaSuccess) return e;
  if (p.num_pages == 0) return cudaSuccess;
  PageCopyKernel<true><<<p.num_pages * 2 * p.kv_heads, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchPageScatterAddF32(const PageCopyParams& p, cudaStream_t stream) {
  if (p.elem_bytes != 4) return cudaErrorInvalidValue;
  if (cudaError_t e = CheckParams(p); e != cudaSuccess) return e;
  if (p.num_pages == 0) return cudaSuccess;
  PageScatterAddF32Kernel<<<p.num_pages * 2 * p.kv_heads, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace oomb::kernels
