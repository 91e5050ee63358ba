// CUDA RMSNorm, rotary embedding and SwiGLU. Contract: kernels/layer_ops.h.
//
// RMSNorm: one block of 256 threads a row, the row's sum of squares (or dot product) reduced
// through warp shuffles, then a second pass over the row (from L1 / L2). Rope and SwiGlu: one
// thread an element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/layer_ops.h"

namespace oomb::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
// x rounded to T and back: the value a composite op leaves between two steps.
template <typename T>
__device__ __forceinline__ float Round(float x) {
  return ToFloat(FromFloat<T>(x));
}

// The block's sum of v (every thread gets it). blockDim.x == kThreads.
__device__ float BlockSum(float v) {
  __shared__ float partial[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? partial[lane] : 0.f;
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__global__ void RmsNormForwardKernel(RmsNormParams p) {
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + row * p.cols;
  const T* w = static_cast<const T*>(p.weight);
  T* y = static_cast<T*>(p.out) + row * p.cols;
  float sq = 0;
  for (int64_t i = threadIdx.x; i < p.cols; i += kThreads) {
    const float v = ToFloat(x[i]);
    sq += v * v;
  }
  const float rstd = rsqrtf(BlockSum(sq) / static_cast<float>(p.cols) + p.eps);
  for (int64_t i = threadIdx.x; i < p.cols; i += kThreads) {
    y[i] = FromFloat<T>(ToFloat(w[i]) * Round<T>(ToFloat(x[i]) * rstd));
  }
  if (threadIdx.x == 0) p.rstd[row] = rstd;
}

template <typename T>
__global__ void RmsNormBackwardKernel(RmsNormParams p) {
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + row * p.cols;
  const T* dy = static_cast<const T*>(p.dy) + row * p.cols;
  const T* w = static_cast<const T*>(p.weight);
  T* dx = static_cast<T*>(p.out) + row * p.cols;
  const float rstd = p.rstd[row];
  float dot = 0;
  for (int64_t i = threadIdx.x; i < p.cols; i += kThreads) {
    dot += ToFloat(dy[i]) * ToFloat(w[i]) * (ToFloat(x[i]) * rstd);
  }
  const float mean = BlockSum(dot) / static_cast<float>(p.cols);
  for (int64_t i = threadIdx.x; i < p.cols; i += kThreads) {
    const float g = ToFloat(dy[i]) * ToFloat(w[i]), xhat = ToFloat(x[i]) * rstd;
    dx[i] = FromFloat<T>(rstd * (g - xhat * mean));
  }
}

template <typename T>
__global__ void RopeKernel(RopeParams p) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= p.rows * p.heads * p.head_dim) return;
  const int64_t half = p.head_dim / 2, d = idx % p.head_dim, row = idx / (p.heads * p.head_dim);
  const T* x = static_cast<const T*>(p.x);
  const float c = ToFloat(static_cast<const T*>(p.cos)[row * p.head_dim + d]);
  const T* sin = static_cast<const T*>(p.sin) + row * p.head_dim;
  const bool first = d < half;
  const int64_t partner = first ? idx + half : idx - half, dp = first ? d + half : d - half;
  float rotated;
  if (!p.backward) {  // rotate_half(x)[d] * sin[d]
    const float r = ToFloat(x[partner]);
    rotated = Round<T>((first ? -r : r) * ToFloat(sin[d]));
  } else {  // rotate_half^T(dy * sin)[d]
    const float r = Round<T>(ToFloat(x[partner]) * ToFloat(sin[dp]));
    rotated = first ? r : -r;
  }
  static_cast<T*>(p.out)[idx] = FromFloat<T>(Round<T>(ToFloat(x[idx]) * c) + rotated);
}

// silu as ATen's kernel computes it (ActivationSiluKernel.cu), and its derivative.
__device__ __forceinline__ float Silu(float x) { return x / (1.f + ::expf(-x)); }
__device__ __forceinline__ float SiluBackward(float dy, float x) {
  const float s = 1.f / (1.f + ::expf(-x));
  return dy * s * (1.f + x * (1.f - s));
}

template <typename T>
__global__ void SwiGluForwardKernel(SwiGluParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= p.n) return;
  const float s = Round<T>(Silu(ToFloat(static_cast<const T*>(p.gate)[i])));
  static_cast<T*>(p.out)[i] = FromFloat<T>(s * ToFloat(static_cast<const T*>(p.up)[i]));
}

template <typename T>
__global__ void SwiGluBackwardKernel(SwiGluParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= p.n) return;
  const float g = ToFloat(static_cast<const T*>(p.gate)[i]), dy = ToFloat(static_cast<const T*>(p.dy)[i]);
  const float s = Round<T>(Silu(g));
  static_cast<T*>(p.d_up)[i] = FromFloat<T>(dy * s);
  const float ds = Round<T>(dy * ToFloat(static_cast<const T*>(p.up)[i]));
  static_cast<T*>(p.out)[i] = FromFloat<T>(SiluBackward(ds, g));
}

unsigned Blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// One launch of the kernel for p's dtype.
template <typename Params>
cudaError_t Launch(const Params& p, unsigned blocks, cudaStream_t stream, void (*bf16)(Params), void (*f16)(Params)) {
  if (blocks == 0) return cudaSuccess;
  void (*kernel)(Params) = p.dtype == HalfDtype::kBFloat16 ? bf16 : f16;
  kernel<<<blocks, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchRmsNormForward(const RmsNormParams& p, cudaStream_t stream) {
  return Launch(p, static_cast<unsigned>(p.rows), stream, RmsNormForwardKernel<__nv_bfloat16>,
                RmsNormForwardKernel<__half>);
}
cudaError_t LaunchRmsNormBackward(const RmsNormParams& p, cudaStream_t stream) {
  return Launch(p, static_cast<unsigned>(p.rows), stream, RmsNormBackwardKernel<__nv_bfloat16>,
                RmsNormBackwardKernel<__half>);
}
cudaError_t LaunchRope(const RopeParams& p, cudaStream_t stream) {
  return Launch(p, Blocks(p.rows * p.heads * p.head_dim), stream, RopeKernel<__nv_bfloat16>, RopeKernel<__half>);
}
cudaError_t LaunchSwiGluForward(const SwiGluParams& p, cudaStream_t stream) {
  return Launch(p, Blocks(p.n), stream, SwiGluForwardKernel<__nv_bfloat16>, SwiGluForwardKernel<__half>);
}
cudaError_t LaunchSwiGluBackward(const SwiGluParams& p, cudaStream_t stream) {
  return Launch(p, Blocks(p.n), stream, SwiGluBackwardKernel<__nv_bfloat16>, SwiGluBackwardKernel<__half>);
}

}  // namespace oomb::kernels
