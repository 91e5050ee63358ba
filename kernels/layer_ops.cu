// CUDA RMSNorm, rotary embedding and gated activations (SwiGLU, Gemma's GELU-tanh GLU).
// Contract: kernels/layer_ops.h.
//
// RMSNorm: one block of 256 threads a row (a warp a row, 8 rows a block, for rows of at most
// 1024 features: a head's q/k norm), the row's sum of squares (or dot product) reduced through
// warp shuffles, then a second pass over the row (from L1 / L2). Rope: a thread a pair
// of elements (x1, x2) of one head. Glu: a thread an element (of rows read and written at their
// strides where GluParams gives them: the halves of one gate_up tensor; with a row scale, a warp a
// row in backward, which sums the scale's gradient). Each takes 8 elements at a time
// (16-byte loads) where the sizes and pointers allow, else one. CrossEntropyRows: one block a
// row, an online max and sum of exponentials per thread merged through warp shuffles, then a
// second pass that writes the gradient over the row. PairSum: a thread 8 (or 1) elements of a
// token's output, summed over its pairs' rows in float32. AttentionMerge: a thread 8 (or 1)
// elements of one head's output row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>

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

// V consecutive elements, loaded and stored at once (V = 8: 16 bytes).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <typename T, int V>
__device__ __forceinline__ Pack<T, V> Load(const void* base, int64_t i) {
  return *reinterpret_cast<const Pack<T, V>*>(static_cast<const T*>(base) + i);
}
template <typename T, int V>
__device__ __forceinline__ void Store(void* base, int64_t i, const Pack<T, V>& x) {
  *reinterpret_cast<Pack<T, V>*>(static_cast<T*>(base) + i) = x;
}

// What an RMSNorm multiplies the normalised input by: w, or Gemma's 1 + w.
template <typename T>
__device__ __forceinline__ float Scale(const RmsNormParams& p, T w) {
  return p.one_plus_weight ? ToFloat(w) + 1.f : ToFloat(w);
}

// A warp's sum of v (every lane gets it).
__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The threads that take one row of an RMSNorm: the block (kWarp false), or a warp, kThreads / 32
// rows a block (kWarp true: rows of at most kWarpRowCols, such as a head's q/k norm, where a
// block would leave most of its threads idle).
constexpr int64_t kWarpRowCols = 1024;
template <bool kWarp>
struct RowTeam {
  int64_t row;  // >= rows: past the last row (the whole team)
  int lane, size;
  __device__ RowTeam()
      : row(kWarp ? static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32 : blockIdx.x),
        lane(kWarp ? threadIdx.x % 32 : threadIdx.x),
        size(kWarp ? 32 : kThreads) {}
  __device__ float Sum(float v) const { return kWarp ? WarpSum(v) : BlockSum(v); }
};

template <typename T, int V, bool kWarp>
__global__ void RmsNormForwardKernel(RmsNormParams p) {
  const RowTeam<kWarp> team;
  if (team.row >= p.rows) return;
  const int64_t row = team.row * p.cols;
  float sq = 0;
  for (int64_t i = team.lane * V; i < p.cols; i += team.size * V) {
    const Pack<T, V> x = Load<T, V>(p.x, row + i);
    for (int k = 0; k < V; ++k) sq += ToFloat(x.v[k]) * ToFloat(x.v[k]);
  }
  const float rstd = rsqrtf(team.Sum(sq) / static_cast<float>(p.cols) + p.eps);
  for (int64_t i = team.lane * V; i < p.cols; i += team.size * V) {
    const Pack<T, V> x = Load<T, V>(p.x, row + i), w = Load<T, V>(p.weight, i);
    Pack<T, V> y;
    for (int k = 0; k < V; ++k) {
      y.v[k] = p.one_plus_weight ? FromFloat<T>(ToFloat(x.v[k]) * rstd * (ToFloat(w.v[k]) + 1.f))
                                 : FromFloat<T>(ToFloat(w.v[k]) * Round<T>(ToFloat(x.v[k]) * rstd));
    }
    Store<T, V>(p.out, row + i, y);
  }
  if (team.lane == 0) p.rstd[team.row] = rstd;
}

template <typename T, int V, bool kWarp>
__global__ void RmsNormBackwardKernel(RmsNormParams p) {
  const RowTeam<kWarp> team;
  if (team.row >= p.rows) return;
  const int64_t row = team.row * p.cols;
  const float rstd = p.rstd[team.row];
  float dot = 0;
  for (int64_t i = team.lane * V; i < p.cols; i += team.size * V) {
    const Pack<T, V> x = Load<T, V>(p.x, row + i), dy = Load<T, V>(p.dy, row + i), w = Load<T, V>(p.weight, i);
    for (int k = 0; k < V; ++k) dot += ToFloat(dy.v[k]) * Scale(p, w.v[k]) * (ToFloat(x.v[k]) * rstd);
  }
  const float mean = team.Sum(dot) / static_cast<float>(p.cols);
  for (int64_t i = team.lane * V; i < p.cols; i += team.size * V) {
    const Pack<T, V> x = Load<T, V>(p.x, row + i), dy = Load<T, V>(p.dy, row + i), w = Load<T, V>(p.weight, i);
    Pack<T, V> dx;
    for (int k = 0; k < V; ++k) {
      const float g = ToFloat(dy.v[k]) * Scale(p, w.v[k]), xhat = ToFloat(x.v[k]) * rstd;
      dx.v[k] = FromFloat<T>(rstd * (g - xhat * mean));
    }
    Store<T, V>(p.out, row + i, dx);
  }
}

// A thread takes V elements j.. of the first half of one (row, head) and their partners j +
// head_dim / 2 in the second: rotate_half(x) = [-x2, x1] pairs exactly those.
template <typename T, int V>
__global__ void RopeKernel(RopeParams p) {
  const int64_t half = p.head_dim / 2, groups = half / V;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= p.rows * p.heads * groups) return;
  const int64_t j = (t % groups) * V, vec = t / groups, row = vec / p.heads;
  const int64_t x1 = vec * p.head_dim + j, x2 = x1 + half, t1 = row * p.head_dim + j, t2 = t1 + half;
  const Pack<T, V> a = Load<T, V>(p.x, x1), b = Load<T, V>(p.x, x2);
  const Pack<T, V> c1 = Load<T, V>(p.cos, t1), c2 = Load<T, V>(p.cos, t2);
  const Pack<T, V> s1 = Load<T, V>(p.sin, t1), s2 = Load<T, V>(p.sin, t2);
  Pack<T, V> y1, y2;
  for (int k = 0; k < V; ++k) {
    const float u = ToFloat(a.v[k]), w = ToFloat(b.v[k]);
    const float uc = Round<T>(u * ToFloat(c1.v[k])), wc = Round<T>(w * ToFloat(c2.v[k]));
    if (!p.backward) {  // y1 = x1 cos1 - x2 sin1, y2 = x2 cos2 + x1 sin2
      y1.v[k] = FromFloat<T>(uc - Round<T>(w * ToFloat(s1.v[k])));
      y2.v[k] = FromFloat<T>(wc + Round<T>(u * ToFloat(s2.v[k])));
    } else {  // dx1 = dy1 cos1 + dy2 sin2, dx2 = dy2 cos2 - dy1 sin1
      y1.v[k] = FromFloat<T>(uc + Round<T>(w * ToFloat(s2.v[k])));
      y2.v[k] = FromFloat<T>(wc - Round<T>(u * ToFloat(s1.v[k])));
    }
  }
  Store<T, V>(p.out, x1, y1);
  Store<T, V>(p.out, x2, y2);
}

// silu as ATen's kernel computes it (ActivationSiluKernel.cu), and its derivative.
__device__ __forceinline__ float Silu(float x) { return x / (1.f + ::expf(-x)); }
__device__ __forceinline__ float SiluBackward(float dy, float x) {
  const float s = 1.f / (1.f + ::expf(-x));
  return dy * s * (1.f + x * (1.f - s));
}

// gelu with the tanh approximation as ATen's kernel computes it (ActivationGeluKernel.cu), and
// its derivative.
constexpr float kGeluBeta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5);
constexpr float kGeluKappa = 0.044715f;
__device__ __forceinline__ float GeluTanh(float x) {
  const float x_cube = x * x * x;
  const float inner = kGeluBeta * (x + kGeluKappa * x_cube);
  return 0.5f * x * (1.f + ::tanhf(inner));
}
__device__ __forceinline__ float GeluTanhBackward(float dy, float x) {
  const float x_sq = x * x, x_cube = x_sq * x;
  const float inner = kGeluBeta * (x + kGeluKappa * x_cube);
  const float tanh_inner = ::tanhf(inner);
  const float left = 0.5f * x, right = 1.f + tanh_inner;
  const float left_derivative = 0.5f * right;
  const float right_derivative = left * (1.f - tanh_inner * tanh_inner);
  const float inner_derivative = kGeluBeta * (1.f + 3.f * kGeluKappa * x_sq);
  return dy * (left_derivative + right_derivative * inner_derivative);
}

__device__ __forceinline__ float Activation(const GluParams& p, float x) {
  return p.act == GluActivation::kGeluTanh ? GeluTanh(x) : Silu(x);
}
__device__ __forceinline__ float ActivationBackward(const GluParams& p, float dy, float x) {
  return p.act == GluActivation::kGeluTanh ? GeluTanhBackward(dy, x) : SiluBackward(dy, x);
}

// Element i of a GluParams tensor of rows `cols` long, `ld` apart (ld 0: contiguous).
__device__ __forceinline__ int64_t GluOffset(int64_t i, int64_t cols, int64_t ld) {
  if (ld == 0) return i;
  const int64_t row = i / cols;
  return row * ld + (i - row * cols);
}

// The gated activation's value r(r(act(g)) * u), unrounded.
template <typename T>
__device__ __forceinline__ float GluValue(const GluParams& p, float g, float u) {
  return Round<T>(Activation(p, g)) * u;
}

template <typename T, int V>
__global__ void GluForwardKernel(GluParams p) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * V;
  if (i >= p.n) return;
  const int64_t in = GluOffset(i, p.cols, p.in_ld);
  Pack<T, V> g = Load<T, V>(p.gate, in), u = Load<T, V>(p.up, in);
  if (p.gate_add != nullptr) {
    const Pack<T, V> ga = Load<T, V>(p.gate_add, in), ua = Load<T, V>(p.up_add, in);
    for (int k = 0; k < V; ++k) {
      g.v[k] = FromFloat<T>(ToFloat(g.v[k]) + ToFloat(ga.v[k]));
      u.v[k] = FromFloat<T>(ToFloat(u.v[k]) + ToFloat(ua.v[k]));
    }
    if (p.gate_sum != nullptr) {
      Store<T, V>(p.gate_sum, in, g);
      Store<T, V>(p.up_sum, in, u);
    }
  }
  // Scaled rows: a pack lies in one row (GluRowsTake8).
  const float s = p.scale == nullptr ? 0.f : ToFloat(static_cast<const T*>(p.scale)[i / p.cols]);
  Pack<T, V> y;
  for (int k = 0; k < V; ++k) {
    const float a = GluValue<T>(p, ToFloat(g.v[k]), ToFloat(u.v[k]));
    y.v[k] = FromFloat<T>(p.scale == nullptr ? a : Round<T>(a) * s);
  }
  Store<T, V>(p.out, i, y);
}

template <typename T, int V>
__global__ void GluBackwardKernel(GluParams p) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * V;
  if (i >= p.n) return;
  const int64_t in = GluOffset(i, p.cols, p.in_ld), grad = GluOffset(i, p.cols, p.grad_ld);
  const Pack<T, V> g = Load<T, V>(p.gate, in), u = Load<T, V>(p.up, in), dy = Load<T, V>(p.dy, i);
  Pack<T, V> d_gate, d_up;
  for (int k = 0; k < V; ++k) {
    const float gk = ToFloat(g.v[k]), dk = ToFloat(dy.v[k]);
    d_up.v[k] = FromFloat<T>(dk * Round<T>(Activation(p, gk)));
    d_gate.v[k] = FromFloat<T>(ActivationBackward(p, Round<T>(dk * ToFloat(u.v[k])), gk));
  }
  Store<T, V>(p.out, grad, d_gate);
  Store<T, V>(p.d_up, grad, d_up);
}

// Scaled rows' backward: a warp a row, its lanes V elements at a time along the row; the row's
// d_scale summed in float32 through warp shuffles.
template <typename T, int V>
__global__ void ScaledGluBackwardKernel(GluParams p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.n / p.cols) return;  // the whole warp
  const float s = ToFloat(static_cast<const T*>(p.scale)[row]);
  float d_s = 0.f;
  for (int64_t c = static_cast<int64_t>(lane) * V; c < p.cols; c += 32 * V) {
    const int64_t in = row * p.in_ld + c, grad = row * p.grad_ld + c, i = row * p.cols + c;
    const Pack<T, V> g = Load<T, V>(p.gate, in), u = Load<T, V>(p.up, in), dy = Load<T, V>(p.dy, i);
    Pack<T, V> d_gate, d_up;
    for (int k = 0; k < V; ++k) {
      const float gk = ToFloat(g.v[k]), uk = ToFloat(u.v[k]), dk = ToFloat(dy.v[k]);
      d_s += Round<T>(dk * Round<T>(GluValue<T>(p, gk, uk)));
      const float d_glu = Round<T>(dk * s);
      d_up.v[k] = FromFloat<T>(d_glu * Round<T>(Activation(p, gk)));
      d_gate.v[k] = FromFloat<T>(ActivationBackward(p, Round<T>(d_glu * uk), gk));
    }
    Store<T, V>(p.out, grad, d_gate);
    Store<T, V>(p.d_up, grad, d_up);
  }
  for (int o = 16; o > 0; o /= 2) d_s += __shfl_xor_sync(0xffffffffu, d_s, o);
  if (lane == 0) static_cast<T*>(p.d_scale)[row] = FromFloat<T>(d_s);
}

template <typename T, int V>
__global__ void PairSumKernel(PairSumParams p) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * V;
  if (i >= p.tokens * p.cols) return;
  const int64_t t = i / p.cols, c = i - t * p.cols;
  float acc[V] = {};
  for (int64_t j = 0; j < p.top_k; ++j) {
    const int64_t row = p.inverse[t * p.top_k + j] * p.cols + c;
    const Pack<T, V> r = Load<T, V>(p.rows, row);
    for (int k = 0; k < V; ++k) acc[k] += ToFloat(r.v[k]);
    if (p.extra == nullptr) continue;
    const Pack<T, V> e = Load<T, V>(p.extra, row);
    for (int k = 0; k < V; ++k) acc[k] += ToFloat(e.v[k]);
  }
  Pack<T, V> y;
  for (int k = 0; k < V; ++k) y.v[k] = FromFloat<T>(acc[k]);
  Store<T, V>(p.out, i, y);
}

// V elements of a float32 tensor (`f32`) or of T's, as float32.
template <typename T, int V>
__device__ __forceinline__ void LoadFloats(const void* base, bool f32, int64_t i, float* x) {
  if (f32) {
    const Pack<float, V> v = Load<float, V>(base, i);
    for (int k = 0; k < V; ++k) x[k] = v.v[k];
  } else {
    const Pack<T, V> v = Load<T, V>(base, i);
    for (int k = 0; k < V; ++k) x[k] = ToFloat(v.v[k]);
  }
}

template <typename T, int V>
__global__ void AttentionMergeKernel(AttentionMergeParams p) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * V;
  if (i >= p.batch * p.rows * p.heads * p.head_dim) return;
  const int64_t row_head = i / p.head_dim, h = row_head % p.heads, batch_row = row_head / p.heads;
  const int64_t l = (batch_row / p.rows * p.heads + h) * p.rows + batch_row % p.rows;
  const float wa = expf(__fsub_rn(p.lse_a[l], p.lse[l])), wb = expf(__fsub_rn(p.lse_b[l], p.lse[l]));
  float a[V];
  LoadFloats<T, V>(p.a, p.a_f32, i, a);
  const Pack<T, V> b = Load<T, V>(p.b, i);
  float y[V];
  for (int k = 0; k < V; ++k) y[k] = __fadd_rn(__fmul_rn(a[k], wa), __fmul_rn(ToFloat(b.v[k]), wb));
  if (p.out_f32) {
    Pack<float, V> o;
    for (int k = 0; k < V; ++k) o.v[k] = y[k];
    Store<float, V>(p.out, i, o);
  } else {
    Pack<T, V> o;
    for (int k = 0; k < V; ++k) o.v[k] = FromFloat<T>(y[k]);
    Store<T, V>(p.out, i, o);
  }
}

// (m, s): a running max and sum of exp(x - m); merges (m2, s2) into it. m = -inf: empty.
__device__ __forceinline__ void MergeMaxSum(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;
  s = s * expf(m - mx) + s2 * expf(m2 - mx);
  m = mx;
}

// The block's (max, sum of exp(x - max)) over every thread's pair (every thread gets it).
__device__ void BlockMaxSum(float& m, float& s) {
  __shared__ float part_m[kThreads / 32], part_s[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    MergeMaxSum(m, s, m2, s2);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) {
    part_m[warp] = m;
    part_s[warp] = s;
  }
  __syncthreads();
  m = lane < kThreads / 32 ? part_m[lane] : -INFINITY;
  s = lane < kThreads / 32 ? part_s[lane] : 0.f;
  for (int o = 16; o > 0; o /= 2) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    MergeMaxSum(m, s, m2, s2);
  }
}

template <typename T, int V>
__global__ void CrossEntropyRowsKernel(CrossEntropyParams p) {
  const int64_t row = blockIdx.x * p.vocab, label = p.labels[blockIdx.x];
  // Read before the block's first barrier, so before any thread overwrites the row.
  const float picked = label >= 0 ? ToFloat(static_cast<const T*>(p.logits)[row + label]) : 0.f;
  float m = -INFINITY, s = 0;
  for (int64_t i = threadIdx.x * V; i < p.vocab; i += kThreads * V) {
    const Pack<T, V> x = Load<T, V>(p.logits, row + i);
    for (int k = 0; k < V; ++k) {
      const float xk = ToFloat(x.v[k]);
      if (xk > m) {
        s = s * expf(m - xk) + 1.f;
        m = xk;
      } else {
        s += expf(xk - m);
      }
    }
  }
  BlockMaxSum(m, s);
  const float lse = m + logf(s);
  if (threadIdx.x == 0) p.loss[blockIdx.x] = label >= 0 ? lse - picked : 0.f;
  if (!p.write_grad) return;
  for (int64_t i = threadIdx.x * V; i < p.vocab; i += kThreads * V) {
    const Pack<T, V> x = Load<T, V>(p.logits, row + i);
    Pack<T, V> g;
    for (int k = 0; k < V; ++k) {
      const float d = label < 0 ? 0.f : expf(ToFloat(x.v[k]) - lse) - (i + k == label ? 1.f : 0.f);
      g.v[k] = FromFloat<T>(d);
    }
    Store<T, V>(p.logits, row + i, g);
  }
}

unsigned Blocks(int64_t threads) { return static_cast<unsigned>((threads + kThreads - 1) / kThreads); }

// Whether every pointer is aligned to `bytes` (16: the 16-byte loads of 8 half elements).
bool Aligned(std::initializer_list<const void*> ptrs, uintptr_t bytes = 16) {
  for (const void* q : ptrs) {
    if (q != nullptr && reinterpret_cast<uintptr_t>(q) % bytes != 0) return false;
  }
  return true;
}

// A kernel's four instances: bfloat16 / float16, one element or 8 at a time.
template <typename Params>
struct Kernels {
  void (*bf16)(Params);
  void (*bf16_x8)(Params);
  void (*f16)(Params);
  void (*f16_x8)(Params);
};
#define OOMB_LAYER_KERNELS(K) \
  { K<__nv_bfloat16, 1>, K<__nv_bfloat16, 8>, K<__half, 1>, K<__half, 8> }

// One launch of the instance for p's dtype, 8 elements at a time where `x8`.
template <typename Params>
cudaError_t Launch(const Params& p, const Kernels<Params>& k, bool x8, unsigned blocks, cudaStream_t stream) {
  if (blocks == 0) return cudaSuccess;
  void (*kernel)(Params) = p.dtype == HalfDtype::kBFloat16 ? (x8 ? k.bf16_x8 : k.bf16) : (x8 ? k.f16_x8 : k.f16);
  kernel<<<blocks, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

// An RMSNorm kernel's instances a row of a warp (`warp`, rows of at most kWarpRowCols) and a
// row of a block (`block`), and the launch of the one for p.
#define OOMB_RMS_NORM_KERNELS(K, W) \
  { K<__nv_bfloat16, 1, W>, K<__nv_bfloat16, 8, W>, K<__half, 1, W>, K<__half, 8, W> }
cudaError_t LaunchRmsNorm(const RmsNormParams& p, bool x8, const Kernels<RmsNormParams>& warp,
                          const Kernels<RmsNormParams>& block, cudaStream_t stream) {
  if (p.cols <= kWarpRowCols) {
    constexpr int64_t kRowsPerBlock = kThreads / 32;
    return Launch<RmsNormParams>(p, warp, x8, static_cast<unsigned>((p.rows + kRowsPerBlock - 1) / kRowsPerBlock),
                                 stream);
  }
  return Launch<RmsNormParams>(p, block, x8, static_cast<unsigned>(p.rows), stream);
}

// Whether a GluParams' rows keep 8-element groups whole and 16-byte aligned.
bool GluRowsTake8(const GluParams& p) {
  return p.n % 8 == 0 && (p.in_ld == 0 || (p.cols % 8 == 0 && p.in_ld % 8 == 0 && p.grad_ld % 8 == 0));
}

}  // namespace

cudaError_t LaunchRmsNormForward(const RmsNormParams& p, cudaStream_t stream) {
  const bool x8 = p.cols % 8 == 0 && Aligned({p.x, p.weight, p.out});
  return LaunchRmsNorm(p, x8, OOMB_RMS_NORM_KERNELS(RmsNormForwardKernel, true),
                       OOMB_RMS_NORM_KERNELS(RmsNormForwardKernel, false), stream);
}
cudaError_t LaunchRmsNormBackward(const RmsNormParams& p, cudaStream_t stream) {
  const bool x8 = p.cols % 8 == 0 && Aligned({p.x, p.weight, p.dy, p.out});
  return LaunchRmsNorm(p, x8, OOMB_RMS_NORM_KERNELS(RmsNormBackwardKernel, true),
                       OOMB_RMS_NORM_KERNELS(RmsNormBackwardKernel, false), stream);
}
cudaError_t LaunchRope(const RopeParams& p, cudaStream_t stream) {
  const bool x8 = (p.head_dim / 2) % 8 == 0 && Aligned({p.x, p.cos, p.sin, p.out});
  return Launch<RopeParams>(p, OOMB_LAYER_KERNELS(RopeKernel), x8,
                            Blocks(p.rows * p.heads * p.head_dim / 2 / (x8 ? 8 : 1)), stream);
}
cudaError_t LaunchGluForward(const GluParams& p, cudaStream_t stream) {
  const bool x8 = GluRowsTake8(p) && Aligned({p.gate, p.up, p.out, p.gate_add, p.up_add, p.gate_sum, p.up_sum});
  return Launch<GluParams>(p, OOMB_LAYER_KERNELS(GluForwardKernel), x8, Blocks(p.n / (x8 ? 8 : 1)), stream);
}
cudaError_t LaunchGluBackward(const GluParams& p, cudaStream_t stream) {
  const bool x8 = GluRowsTake8(p) && Aligned({p.gate, p.up, p.dy, p.out, p.d_up});
  if (p.scale != nullptr) {
    constexpr int64_t kRowsPerBlock = kThreads / 32;
    return Launch<GluParams>(p, OOMB_LAYER_KERNELS(ScaledGluBackwardKernel), x8,
                             static_cast<unsigned>((p.n / p.cols + kRowsPerBlock - 1) / kRowsPerBlock), stream);
  }
  return Launch<GluParams>(p, OOMB_LAYER_KERNELS(GluBackwardKernel), x8, Blocks(p.n / (x8 ? 8 : 1)), stream);
}

cudaError_t LaunchPairSum(const PairSumParams& p, cudaStream_t stream) {
  const bool x8 = p.cols % 8 == 0 && Aligned({p.rows, p.extra, p.out});
  return Launch<PairSumParams>(p, OOMB_LAYER_KERNELS(PairSumKernel), x8, Blocks(p.tokens * p.cols / (x8 ? 8 : 1)),
                               stream);
}

cudaError_t LaunchAttentionMerge(const AttentionMergeParams& p, cudaStream_t stream) {
  // 8 elements of a float32 tensor: 32-byte loads.
  const bool x8 = p.head_dim % 8 == 0 && Aligned({p.b}) && Aligned({p.a}, p.a_f32 ? 32 : 16) &&
                  Aligned({p.out}, p.out_f32 ? 32 : 16);
  return Launch<AttentionMergeParams>(p, OOMB_LAYER_KERNELS(AttentionMergeKernel), x8,
                                      Blocks(p.batch * p.rows * p.heads * p.head_dim / (x8 ? 8 : 1)), stream);
}

cudaError_t LaunchCrossEntropyRows(const CrossEntropyParams& p, cudaStream_t stream) {
  const bool x8 = p.vocab % 8 == 0 && Aligned({p.logits});
  return Launch<CrossEntropyParams>(p, OOMB_LAYER_KERNELS(CrossEntropyRowsKernel), x8, static_cast<unsigned>(p.rows),
                                    stream);
}

}  // namespace oomb::kernels
