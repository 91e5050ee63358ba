// CUDA gather / accumulate of selected pages. Contract: kernels/selected_pages.h.
//
// Grid: x = entry (or sorted entry), y = 2 * kSplits (K or V, and a slice of the run); each
// thread moves 8 elements at a time (16 bytes of bf16, 32 of float32).
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/selected_pages.h"

namespace oomb::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kSplits = 8;

struct Vec8 {
  float x[8];
};

template <typename T>
__device__ __forceinline__ Vec8 Load8(const T* p);
template <>
__device__ __forceinline__ Vec8 Load8<float>(const float* p) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  return Vec8{{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w}};
}
template <>
__device__ __forceinline__ Vec8 Load8<__nv_bfloat16>(const __nv_bfloat16* p) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
  Vec8 r;
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    r.x[2 * i] = f.x;
    r.x[2 * i + 1] = f.y;
  }
  return r;
}

template <typename T>
__device__ __forceinline__ void Store8(T* p, const Vec8& v);
template <>
__device__ __forceinline__ void Store8<float>(float* p, const Vec8& v) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v.x[0], v.x[1], v.x[2], v.x[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v.x[4], v.x[5], v.x[6], v.x[7]);
}
template <>
__device__ __forceinline__ void Store8<__nv_bfloat16>(__nv_bfloat16* p, const Vec8& v) {
  uint4 u;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v.x[2 * i], v.x[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = u;
}

__device__ __forceinline__ int64_t SlotRun(const SelectedPagesParams& p, int64_t slot, int64_t kv, int64_t head) {
  return ((slot * 2 + kv) * p.kv_heads + head) * p.page_tokens * p.head_dim;
}

template <typename T>
__global__ void GatherSelectedKernel(SelectedPagesParams p) {
  const int64_t e = blockIdx.x, kv = blockIdx.y % 2, split = blockIdx.y / 2;
  const int64_t run = p.page_tokens * p.head_dim, page = p.selection[e], head = (e / p.n) % p.kv_heads;
  T* dst = static_cast<T*>(kv == 0 ? p.k : p.v) + e * run;
  const T* src = nullptr;
  if (page >= 0) {
    if (p.second == nullptr) {
      src = static_cast<const T*>(p.arena) + SlotRun(p, p.slots[page], kv, head);
    } else {  // a slot per entry; a negative one names a packed image of `second`
      const int64_t slot = p.slots[e];
      src = slot >= 0 ? static_cast<const T*>(p.arena) + SlotRun(p, slot, kv, head)
                      : static_cast<const T*>(p.second) + ((-slot - 1) * 2 + kv) * run;
    }
  }
  constexpr int kPerVec = 16 / sizeof(T);
  for (int64_t i = (split * kThreads + threadIdx.x) * kPerVec; i < run; i += kSplits * kThreads * kPerVec) {
    *reinterpret_cast<uint4*>(dst + i) = src != nullptr ? *reinterpret_cast<const uint4*>(src + i) : uint4{0, 0, 0, 0};
  }
}

template <typename TArena, typename TBuffer>
__global__ void AccumulateSelectedKernel(SelectedPagesParams p) {
  const int64_t first = blockIdx.x, kv = blockIdx.y % 2, split = blockIdx.y / 2;
  const int64_t key = p.sorted_key[first];
  if (first > 0 && p.sorted_key[first - 1] == key) return;  // not its run's first entry
  const int64_t e = p.order[first], page = p.selection[e];
  if (page < 0) return;  // the -1 entries, sorted together
  const int64_t run = p.page_tokens * p.head_dim, head = (e / p.n) % p.kv_heads;
  const int64_t slot = p.second == nullptr ? p.slots[page] : p.slots[e];
  // An arena run is added to; a packed image of `second` is set to the sum.
  TArena* dst = slot >= 0 ? static_cast<TArena*>(p.arena) + SlotRun(p, slot, kv, head)
                          : static_cast<TArena*>(p.second) + ((-slot - 1) * 2 + kv) * run;
  const TBuffer* grads = static_cast<const TBuffer*>(kv == 0 ? p.k : p.v);
  for (int64_t i = (split * kThreads + threadIdx.x) * 8; i < run; i += kSplits * kThreads * 8) {
    Vec8 sum = slot >= 0 ? Load8(dst + i) : Vec8{};
    for (int64_t j = first; j < p.entries && p.sorted_key[j] == key; ++j) {
      const Vec8 g = Load8(grads + p.order[j] * run + i);
      for (int c = 0; c < 8; ++c) sum.x[c] += g.x[c];
    }
    Store8(dst + i, sum);
  }
}

cudaError_t Check(const SelectedPagesParams& p) {
  if (p.entries < 0 || p.n <= 0 || p.kv_heads <= 0 || p.page_tokens <= 0 || p.head_dim <= 0) {
    return cudaErrorInvalidValue;
  }
  if ((p.page_tokens * p.head_dim) % 8 != 0 || p.entries > 0x7fffffff) return cudaErrorInvalidValue;
  return cudaSuccess;
}

template <typename TArena, typename TBuffer>
cudaError_t Accumulate(const SelectedPagesParams& p, cudaStream_t stream) {
  AccumulateSelectedKernel<TArena, TBuffer><<<dim3(p.entries, 2 * kSplits), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchGatherSelectedPages(const SelectedPagesParams& p, cudaStream_t stream) {
  if (cudaError_t e = Check(p); e != cudaSuccess) return e;
  if (p.arena_dtype != p.buffer_dtype) return cudaErrorInvalidValue;
  if (p.entries == 0) return cudaSuccess;
  const dim3 grid(p.entries, 2 * kSplits);
  if (p.arena_dtype == PageDtype::kFloat32) {
    GatherSelectedKernel<float><<<grid, kThreads, 0, stream>>>(p);
  } else {
    GatherSelectedKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t LaunchAccumulateSelectedPages(const SelectedPagesParams& p, cudaStream_t stream) {
  if (cudaError_t e = Check(p); e != cudaSuccess) return e;
  if (p.entries == 0) return cudaSuccess;
  const bool arena_f32 = p.arena_dtype == PageDtype::kFloat32, buffer_f32 = p.buffer_dtype == PageDtype::kFloat32;
  if (arena_f32) {
    return buffer_f32 ? Accumulate<float, float>(p, stream) : Accumulate<float, __nv_bfloat16>(p, stream);
  }
  return buffer_f32 ? Accumulate<__nv_bfloat16, float>(p, stream) : Accumulate<__nv_bfloat16, __nv_bfloat16>(p, stream);
}

}  // namespace oomb::kernels
