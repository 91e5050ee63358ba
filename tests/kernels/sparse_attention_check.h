// Shared checks of sparse attention (kernels/torch/sparse_attention.h), run on the CPU (unit)
// and on CUDA (gpu): the autograd function over a tensor-backed SparsePast against plain
// float64 attention whose mask allows exactly the selected pages and the causal chunk, forward
// and backward (the past's page gradients included).
#ifndef OOMB_TESTS_KERNELS_SPARSE_ATTENTION_CHECK_H_
#define OOMB_TESTS_KERNELS_SPARSE_ATTENTION_CHECK_H_

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/torch/page_select.h"
#include "kernels/torch/sparse_attention.h"

namespace oomb::testing {

// A past of whole pages held in plain tensors [kv_heads, S, D]; page gradients accumulate into
// dk_ / dv_ (float32, or float64 for float64 pages), and the pages ever selected are counted.
class TensorSparsePast final : public kernels::SparsePast {
 public:
  TensorSparsePast(at::Tensor k, at::Tensor v, int64_t page_tokens)
      : k_(std::move(k)), v_(std::move(v)), P_(page_tokens) {
    const auto acc = k_.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    dk_ = at::zeros(k_.sizes(), k_.options().dtype(acc));
    dv_ = at::zeros_like(dk_);
  }
  int64_t past_tokens() const override { return k_.size(1); }
  std::pair<at::Tensor, at::Tensor> GatherPages(const at::Tensor& selection) override {
    return {Gather(k_, selection), Gather(v_, selection)};
  }
  void AccumulatePageGrad(const at::Tensor& selection, const at::Tensor& dk, const at::Tensor& dv) override {
    Scatter(&dk_, selection, dk);
    Scatter(&dv_, selection, dv);
  }
  at::Tensor dk_, dv_;

 private:
  // [Hkv, S, D] -> per KV head h the pages selection[:, h, :]: [n_tiles, Hkv, n * P, D].
  at::Tensor Gather(const at::Tensor& x, const at::Tensor& selection) const {
    const int64_t Hkv = x.size(0), D = x.size(2), n_tiles = selection.size(0), n = selection.size(2);
    const at::Tensor pages = x.view({Hkv, -1, P_, D});
    std::vector<at::Tensor> heads;
    for (int64_t h = 0; h < Hkv; ++h) {
      const at::Tensor sel = selection.select(1, h);  // [n_tiles, n]
      at::Tensor g = pages[h].index_select(0, sel.clamp_min(0).flatten()).view({n_tiles, n, P_, D});
      heads.push_back(g.masked_fill(sel.lt(0).view({n_tiles, n, 1, 1}), 0).view({n_tiles, n * P_, D}));
    }
    return at::stack(heads, 1);
  }
  void Scatter(at::Tensor* acc, const at::Tensor& selection, const at::Tensor& d) const {
    const int64_t Hkv = acc->size(0), D = acc->size(2);
    at::Tensor pages = acc->view({Hkv, -1, P_, D});
    for (int64_t h = 0; h < Hkv; ++h) {
      const at::Tensor sel = selection.select(1, h).flatten();
      const at::Tensor keep = sel.ge(0).nonzero().squeeze(1);
      pages[h].index_add_(0, sel.index_select(0, keep),
                          d.select(1, h).reshape({-1, P_, D}).index_select(0, keep).to(acc->scalar_type()));
    }
  }
  at::Tensor k_, v_;
  int64_t P_;
};

struct SparseErrors {
  double out = 0, dq = 0, dk = 0, dv = 0, dk_past = 0, dv_past = 0, dsinks = 0;
  double max() const { return std::max({out, dq, dk, dv, dk_past, dv_past, dsinks}); }
};

inline double SparseRelErr(const at::Tensor& got, const at::Tensor& want) {
  const double norm = want.to(at::kDouble).norm().cpu().item<double>();
  const double diff = (got.to(at::kDouble).cpu() - want.to(at::kDouble).cpu()).norm().item<double>();
  return norm > 0 ? diff / norm : diff;
}

// A sparse gather's two sources (kernels::GatherSelectedPages with `second`), made from one
// arena: the pages `moved` names leave the arena as a host tier's fetch brings them, packed one
// image [2, page_tokens, head_dim] per (page, KV head selecting it), last page first (any order
// does: the slots name them). `slots`: [num_pages] int32, the arena's; returns the packed images
// and the slot of each selection entry's page, s < 0 naming second[-s - 1].
struct TwoSources {
  at::Tensor second, slots;
};
inline TwoSources MoveToSecond(const at::Tensor& arena, const at::Tensor& slots, const at::Tensor& selection,
                               const std::vector<bool>& moved) {
  const int64_t pages = slots.size(0), kv_heads = arena.size(2);
  const at::Tensor sel = selection.cpu().contiguous();
  std::vector<int32_t> image(pages * kv_heads, 0);  // of a moved (page, head)
  std::vector<at::Tensor> images;
  for (int64_t page = pages - 1; page >= 0; --page) {
    for (int64_t h = 0; h < kv_heads; ++h) {
      if (!moved[page] || !(sel.select(1, h) == page).any().item<bool>()) continue;
      image[page * kv_heads + h] = static_cast<int32_t>(images.size());
      images.push_back(arena[slots[page].item<int32_t>()].select(1, h));
    }
  }
  const int64_t n = sel.size(2);
  std::vector<int32_t> entry_slots(sel.numel(), 0);
  for (int64_t e = 0; e < sel.numel(); ++e) {
    const int64_t page = sel.data_ptr<int64_t>()[e], h = (e / n) % kv_heads;
    if (page < 0) continue;
    entry_slots[e] = moved[page] ? -1 - image[page * kv_heads + h] : slots[page].item<int32_t>();
  }
  return {at::stack(images).contiguous(), at::tensor(entry_slots, at::kInt).view(sel.sizes())};
}

// The mask of the chunk's queries over all S + C keys, [num_heads, C, S + C]: query i of tile
// i / P, head h (KV head h / G) sees past key j iff j's page is in selection[i / P, h / G] and
// j >= doc_start[S + i]; chunk key j iff doc_start[S + i] <= j <= S + i.
inline at::Tensor SelectionMask(const at::Tensor& selection, const at::Tensor& doc_start, int64_t S, int64_t C,
                                int64_t Hq, int64_t P) {
  const int64_t Hkv = selection.size(1), G = Hq / Hkv, T = S + C;
  at::Tensor allowed = at::zeros({Hq, C, T}, at::kBool);
  const at::Tensor sel = selection.cpu();
  const at::Tensor ds = doc_start.cpu();
  auto a = allowed.accessor<bool, 3>();
  auto s = sel.accessor<int64_t, 3>();
  auto d = ds.accessor<int64_t, 1>();
  for (int64_t i = 0; i < C; ++i) {
    for (int64_t h = 0; h < Hq; ++h) {
      for (int64_t n = 0; n < sel.size(2); ++n) {
        const int64_t page = s[i / P][h / G][n];
        if (page < 0) continue;
        for (int64_t j = page * P; j < (page + 1) * P; ++j) a[h][i][j] = j >= d[S + i];
      }
      for (int64_t j = S; j <= S + i; ++j) a[h][i][j] = j >= d[S + i];
    }
  }
  return allowed;
}

// Chunk of C queries at S (S / P past pages), the selection made by SelectPages with `options`
// from the past's summaries (or covering every page when page_budget >= S / P). Inputs are
// drawn in float64 on the CPU (never zeros); sparse attention runs in `dtype` on `device` (the
// fused path with `kernel`); both are compared with masked float64 attention over the whole
// S + C sequence; `sinks`: with attention sinks (gpt-oss), a column of the reference's scores.
inline SparseErrors CheckSparseAttention(at::Device device, at::ScalarType dtype, int64_t S, int64_t C, int64_t Hq,
                                         int64_t Hkv, int64_t D, std::vector<int64_t> doc_starts,
                                         kernels::PageSelectOptions options, uint64_t seed,
                                         at::Tensor* selection_out = nullptr,
                                         kernels::GpuAttentionKernel kernel = kernels::GpuAttentionKernel::kCudnn,
                                         bool sinks = false) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const int64_t T = S + C, P = options.page_tokens;
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor q = at::randn({T, Hq, D}, gen, f64), k = at::randn({T, Hkv, D}, gen, f64),
                   v = at::randn({T, Hkv, D}, gen, f64), dout = at::randn({T, Hq, D}, gen, f64);
  const at::Tensor sink_values = sinks ? at::randn({Hq}, gen, f64).mul_(2) : at::Tensor();
  const at::Tensor rsinks = sinks ? sink_values.clone().requires_grad_(true) : at::Tensor();
  const at::Tensor csinks = sinks ? sink_values.to(device, dtype).requires_grad_(true) : at::Tensor();
  at::Tensor doc_start = at::zeros({T}, at::kLong);
  for (int64_t s : doc_starts) doc_start.slice(0, s).fill_(s);

  const at::Tensor cq = q.slice(0, S).to(device, dtype).requires_grad_(true);
  const at::Tensor ck = k.slice(0, S).to(device, dtype).requires_grad_(true);
  const at::Tensor cv = v.slice(0, S).to(device, dtype).requires_grad_(true);
  const at::Tensor chunk_doc = doc_start.slice(0, S).to(device);
  const bool min_max = options.summary == kernels::PageSummary::kMinMax;
  const at::Tensor summaries =
      S > 0 ? kernels::SummarizePages(k.slice(0, 0, S).to(device, dtype), P, options.summary)
            : at::empty(min_max ? std::vector<int64_t>{0, 2, Hkv, D} : std::vector<int64_t>{0, Hkv, D},
                        f64.device(device).dtype(dtype));
  const at::Tensor selection = kernels::SelectPages(cq.detach(), summaries, chunk_doc, S, options);
  if (selection_out != nullptr) *selection_out = selection.cpu();
  auto past = std::make_shared<TensorSparsePast>(k.slice(0, 0, S).permute({1, 0, 2}).contiguous().to(device, dtype),
                                                 v.slice(0, 0, S).permute({1, 0, 2}).contiguous().to(device, dtype), P);
  const at::Tensor out =
      kernels::SparsePagedAttention(cq, ck, cv, chunk_doc, S > 0 ? past : nullptr, selection, P, kernel, csinks);
  (out * dout.slice(0, S).to(device, dtype)).sum().backward();

  // Reference: float64 attention of the chunk's queries over all T keys, masked to the selection.
  const at::Tensor rq = q.clone().requires_grad_(true), rk = k.clone().requires_grad_(true),
                   rv = v.clone().requires_grad_(true);
  const at::Tensor kk = rk.repeat_interleave(Hq / Hkv, 1).permute({1, 0, 2});  // [Hq, T, D]
  const at::Tensor vv = rv.repeat_interleave(Hq / Hkv, 1).permute({1, 0, 2});
  at::Tensor scores = at::matmul(rq.slice(0, S).permute({1, 0, 2}), kk.transpose(1, 2)) / std::sqrt(double(D));
  scores = scores.masked_fill(SelectionMask(selection, doc_start, S, C, Hq, P).logical_not(),
                              -std::numeric_limits<double>::infinity());
  if (sinks) scores = at::cat({scores, rsinks.view({Hq, 1, 1}).expand({Hq, C, 1})}, -1);
  const at::Tensor probs = at::softmax(scores, -1).narrow(-1, 0, T);
  const at::Tensor rout = at::matmul(probs, vv).permute({1, 0, 2});  // [C, Hq, D]
  (rout * dout.slice(0, S)).sum().backward();

  SparseErrors e;
  e.out = SparseRelErr(out, rout);
  e.dq = SparseRelErr(cq.grad(), rq.grad().slice(0, S));
  e.dk = SparseRelErr(ck.grad(), rk.grad().slice(0, S));
  e.dv = SparseRelErr(cv.grad(), rv.grad().slice(0, S));
  if (sinks) e.dsinks = SparseRelErr(csinks.grad(), rsinks.grad());
  if (S > 0) {
    e.dk_past = SparseRelErr(past->dk_.permute({1, 0, 2}), rk.grad().slice(0, 0, S));
    e.dv_past = SparseRelErr(past->dv_.permute({1, 0, 2}), rv.grad().slice(0, 0, S));
  }
  return e;
}

}  // namespace oomb::testing

#endif  // OOMB_TESTS_KERNELS_SPARSE_ATTENTION_CHECK_H_
