// CUDA page gather / scatter. Contract: kernels/page_copy.h.
//
// Each (page, k|v, head) block of page_tokens * head_dim elements is contiguous both in the
// arena and in the per-head buffer, so a copy is one contiguous run per block: one CUDA block
// per run, 16-byte vector accesses across the block's threads.
#include <cuda_bf16.h>

#include <cstdint>
#include <vector>

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

// Block b copies descriptors b, b + B, ... (B blocks), two at a time: each thread loads its
// kCopyVecs 16-byte vectors of both before storing any, so 64 KiB a block are in flight. The
// descriptors are cut on the host (CopySegments), so no block walks the batch's runs to find
// its share (before, every block read every run's descriptor in turn: thousands a fetch of
// head-sized runs).
constexpr int kCopyThreads = 512;
constexpr int kCopyVecs = static_cast<int>(kCopySegmentBytes / 16 / kCopyThreads);
static_assert(kCopyVecs * kCopyThreads * 16 == kCopySegmentBytes);

__global__ void CopyRunsKernel(const CopyRunDesc* runs, int64_t num_runs) {
  const int64_t stride = gridDim.x;
  for (int64_t r = blockIdx.x; r < num_runs; r += 2 * stride) {
    const CopyRunDesc a = runs[r];
    const CopyRunDesc b = r + stride < num_runs ? runs[r + stride] : CopyRunDesc{};
    const int64_t na = a.bytes / 16, nb = b.bytes / 16;
    uint4 va[kCopyVecs], vb[kCopyVecs];
#pragma unroll
    for (int u = 0; u < kCopyVecs; ++u) {
      const int64_t i = threadIdx.x + u * kCopyThreads;
      if (i < na) va[u] = static_cast<const uint4*>(a.src)[i];
      if (i < nb) vb[u] = static_cast<const uint4*>(b.src)[i];
    }
#pragma unroll
    for (int u = 0; u < kCopyVecs; ++u) {
      const int64_t i = threadIdx.x + u * kCopyThreads;
      if (i < na) static_cast<uint4*>(a.dst)[i] = va[u];
      if (i < nb) static_cast<uint4*>(b.dst)[i] = vb[u];
    }
  }
}

// dst += src for one 16-byte vector of T (bfloat16: summed in float32, rounded to nearest even
// once, as torch and the CPU's addition do).
template <typename T>
__device__ uint4 AddVec(uint4 dst, uint4 src);
template <>
__device__ uint4 AddVec<__nv_bfloat16>(uint4 dst, uint4 src) {
  __nv_bfloat162* d = reinterpret_cast<__nv_bfloat162*>(&dst);
  const __nv_bfloat162* s = reinterpret_cast<const __nv_bfloat162*>(&src);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = __bfloat1622float2(d[i]), b = __bfloat1622float2(s[i]);
    d[i] = __floats2bfloat162_rn(a.x + b.x, a.y + b.y);
  }
  return dst;
}
template <>
__device__ uint4 AddVec<float>(uint4 dst, uint4 src) {
  float* d = reinterpret_cast<float*>(&dst);
  const float* s = reinterpret_cast<const float*>(&src);
#pragma unroll
  for (int i = 0; i < 4; ++i) d[i] += s[i];
  return dst;
}
template <>
__device__ uint4 AddVec<double>(uint4 dst, uint4 src) {
  double* d = reinterpret_cast<double*>(&dst);
  const double* s = reinterpret_cast<const double*>(&src);
  d[0] += s[0];
  d[1] += s[1];
  return dst;
}

// As CopyRunsKernel, but each run's dst += src.
template <typename T>
__global__ void AddRunsKernel(const CopyRunDesc* runs, int64_t num_runs) {
  const int64_t stride = gridDim.x;
  for (int64_t r = blockIdx.x; r < num_runs; r += 2 * stride) {
    const CopyRunDesc a = runs[r];
    const CopyRunDesc b = r + stride < num_runs ? runs[r + stride] : CopyRunDesc{};
    const int64_t na = a.bytes / 16, nb = b.bytes / 16;
    uint4 da[kCopyVecs], db[kCopyVecs], sa[kCopyVecs], sb[kCopyVecs];
#pragma unroll
    for (int u = 0; u < kCopyVecs; ++u) {
      const int64_t i = threadIdx.x + u * kCopyThreads;
      if (i < na) {
        da[u] = static_cast<const uint4*>(a.dst)[i];
        sa[u] = static_cast<const uint4*>(a.src)[i];
      }
      if (i < nb) {
        db[u] = static_cast<const uint4*>(b.dst)[i];
        sb[u] = static_cast<const uint4*>(b.src)[i];
      }
    }
#pragma unroll
    for (int u = 0; u < kCopyVecs; ++u) {
      const int64_t i = threadIdx.x + u * kCopyThreads;
      if (i < na) static_cast<uint4*>(a.dst)[i] = AddVec<T>(da[u], sa[u]);
      if (i < nb) static_cast<uint4*>(b.dst)[i] = AddVec<T>(db[u], sb[u]);
    }
  }
}

}  // namespace

std::vector<CopyRunDesc> CopySegments(const std::vector<CopyRunDesc>& runs) {
  std::vector<CopyRunDesc> segments;
  segments.reserve(runs.size());
  for (const CopyRunDesc& r : runs) {
    for (int64_t done = 0; done < r.bytes; done += kCopySegmentBytes) {
      segments.push_back(CopyRunDesc{static_cast<const char*>(r.src) + done, static_cast<char*>(r.dst) + done,
                                     r.bytes - done < kCopySegmentBytes ? r.bytes - done : kCopySegmentBytes});
    }
  }
  return segments;
}

cudaError_t LaunchCopyRuns(const CopyRunDesc* runs, int64_t num_runs, int blocks, cudaStream_t stream) {
  if (num_runs < 0 || blocks <= 0) return cudaErrorInvalidValue;
  if (num_runs == 0) return cudaSuccess;
  CopyRunsKernel<<<blocks, kCopyThreads, 0, stream>>>(runs, num_runs);
  return cudaGetLastError();
}

cudaError_t LaunchAddRuns(const CopyRunDesc* runs, int64_t num_runs, AddType type, int blocks, cudaStream_t stream) {
  if (num_runs < 0 || blocks <= 0) return cudaErrorInvalidValue;
  if (num_runs == 0) return cudaSuccess;
  switch (type) {
    case AddType::kBFloat16:
      AddRunsKernel<__nv_bfloat16><<<blocks, kCopyThreads, 0, stream>>>(runs, num_runs);
      return cudaGetLastError();
    case AddType::kFloat32:
      AddRunsKernel<float><<<blocks, kCopyThreads, 0, stream>>>(runs, num_runs);
      return cudaGetLastError();
    case AddType::kFloat64:
      AddRunsKernel<double><<<blocks, kCopyThreads, 0, stream>>>(runs, num_runs);
      return cudaGetLastError();
  }
  return cudaErrorInvalidValue;
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
