// Shared checks of the attention over KV pages, run on the CPU (unit) and on CUDA (gpu): the
// paged autograd function against plain dense attention, forward and backward, with a past held
// in a tensor-backed PastKv, packed documents, GQA and key blocks that straddle the chunk.
#ifndef OOMB_TESTS_KERNELS_PAGED_ATTENTION_CHECK_H_
#define OOMB_TESTS_KERNELS_PAGED_ATTENTION_CHECK_H_

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "kernels/torch/paged_attention.h"

namespace oomb::testing {

using kernels::TensorPast;

struct AttentionErrors {
  double out = 0, dq = 0, dk = 0, dv = 0, dk_past = 0, dv_past = 0, dsinks = 0;
  double max() const { return std::max({out, dq, dk, dv, dk_past, dv_past, dsinks}); }
};

inline double RelErr(const at::Tensor& got, const at::Tensor& want) {
  return ((got.to(at::kDouble).cpu() - want.to(at::kDouble).cpu()).norm() / want.to(at::kDouble).norm().cpu())
      .item<double>();
}

// Chunk of C queries at start S (past of S tokens), Hq query heads over Hkv KV heads, head dim
// D; documents start at the given global indices; `window` > 0: a sliding-window layer (query p
// sees key j iff j > p - window, as transformers masks it; the paged function gets its
// SlidingWindowStart); `sinks`: with attention sinks (gpt-oss; drawn with std 2, so that they
// take a real share of the softmax). Inputs are drawn in float64 on the CPU (never zeros), the paged function
// runs in `dtype` on `device` (its fused GPU path with `kernel`); both are compared to the
// dense float64 reference over the whole S + C sequence.
inline AttentionErrors CheckPagedAttention(at::Device device, at::ScalarType dtype, int64_t S, int64_t C, int64_t Hq,
                                           int64_t Hkv, int64_t D, std::vector<int64_t> doc_starts, int64_t key_block,
                                           uint64_t seed,
                                           kernels::GpuAttentionKernel kernel = kernels::GpuAttentionKernel::kCudnn,
                                           int64_t window = 0, bool sinks = false) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const int64_t T = S + C;
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor q = at::randn({T, Hq, D}, gen, f64), k = at::randn({T, Hkv, D}, gen, f64),
                   v = at::randn({T, Hkv, D}, gen, f64), dout = at::randn({T, Hq, D}, gen, f64);
  const at::Tensor sink_values = sinks ? at::randn({Hq}, gen, f64).mul_(2) : at::Tensor();
  const at::Tensor rsinks = sinks ? sink_values.clone().requires_grad_(true) : at::Tensor();
  const at::Tensor csinks = sinks ? sink_values.to(device, dtype).requires_grad_(true) : at::Tensor();
  at::Tensor doc_start = at::zeros({T}, at::kLong);
  for (int64_t s : doc_starts) doc_start.slice(0, s).fill_(s);
  // What the reference sees: each query's first key, its document's start or its window's.
  const at::Tensor first_key = window > 0 ? at::maximum(doc_start, at::arange(T, at::kLong) - window + 1) : doc_start;

  // Reference: dense attention over all T tokens in float64; gradients of the chunk's outputs.
  const at::Tensor rq = q.clone().requires_grad_(true), rk = k.clone().requires_grad_(true),
                   rv = v.clone().requires_grad_(true);
  const at::Tensor rout = kernels::DenseAttentionReference(rq, rk, rv, first_key, rsinks);
  (rout.slice(0, S) * dout.slice(0, S)).sum().backward();

  auto past = std::make_shared<TensorPast>(k.slice(0, 0, S).permute({1, 0, 2}).contiguous().to(device, dtype),
                                           v.slice(0, 0, S).permute({1, 0, 2}).contiguous().to(device, dtype));
  const at::Tensor cq = q.slice(0, S).to(device, dtype).requires_grad_(true);
  const at::Tensor ck = k.slice(0, S).to(device, dtype).requires_grad_(true);
  const at::Tensor cv = v.slice(0, S).to(device, dtype).requires_grad_(true);
  const at::Tensor chunk_docs = doc_start.slice(0, S).to(device);
  const at::Tensor out =
      kernels::PagedAttention(cq, ck, cv, window > 0 ? kernels::SlidingWindowStart(chunk_docs, S, window) : chunk_docs,
                              S > 0 ? past : nullptr, key_block, kernel, {}, csinks);
  (out * dout.slice(0, S).to(device, dtype)).sum().backward();

  AttentionErrors e;
  e.out = RelErr(out, rout.slice(0, S));
  e.dq = RelErr(cq.grad(), rq.grad().slice(0, S));
  e.dk = RelErr(ck.grad(), rk.grad().slice(0, S));
  e.dv = RelErr(cv.grad(), rv.grad().slice(0, S));
  if (sinks) e.dsinks = RelErr(csinks.grad(), rsinks.grad());
  if (S > 0) {
    e.dk_past = RelErr(past->dk.permute({1, 0, 2}), rk.grad().slice(0, 0, S));
    e.dv_past = RelErr(past->dv.permute({1, 0, 2}), rv.grad().slice(0, 0, S));
  }
  return e;
}

}  // namespace oomb::testing

#endif  // OOMB_TESTS_KERNELS_PAGED_ATTENTION_CHECK_H_
