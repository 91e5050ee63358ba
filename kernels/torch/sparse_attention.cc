#include "kernels/torch/sparse_attention.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/torch/attention_inputs.h"
#include "kernels/torch/fused_attention.h"
#include "kernels/torch/gpu_timeline.h"
#include "kernels/torch/matmul.h"
#include "kernels/torch/upload.h"

namespace oomb::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct PastHolder : torch::CustomClassHolder {
  explicit PastHolder(std::shared_ptr<SparsePast> p) : past(std::move(p)) {}
  std::shared_ptr<SparsePast> past;
};

// The chunk's geometry. Query tile t holds rows [Begin(t), End(t)); n_sel pages a tile and head.
struct Geometry {
  int64_t C, Hq, Hkv, G, D, S, P, n_tiles, n_sel;
  double scale;
  int64_t Begin(int64_t t) const { return t * P; }
  int64_t End(int64_t t) const { return std::min(C, (t + 1) * P); }
  int64_t PastKeys() const { return n_sel * P; }
  at::Tensor ToGrouped(const at::Tensor& x) const {  // [C, Hq, D] -> [Hkv, G, C, D]
    return x.reshape({C, Hkv, G, D}).permute({1, 2, 0, 3}).contiguous();
  }
  at::Tensor FromGrouped(const at::Tensor& x) const {  // [Hkv, G, C, D] -> [C, Hq, D]
    return x.permute({2, 0, 1, 3}).reshape({C, Hq, D});
  }
};

Geometry Check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& doc_start,
               const SparsePast* past, const at::Tensor& selection, int64_t page_tokens) {
  CheckChunkAttentionInputs(q, k, v, doc_start);
  TORCH_CHECK(page_tokens > 0, "page_tokens: must be > 0, got ", page_tokens);
  Geometry g;
  g.C = q.size(0);
  g.Hq = q.size(1);
  g.Hkv = k.size(1);
  g.G = g.Hq / g.Hkv;
  g.D = q.size(2);
  g.P = page_tokens;
  g.S = past == nullptr ? 0 : past->past_tokens();
  g.n_tiles = (g.C + g.P - 1) / g.P;
  TORCH_CHECK(g.S % g.P == 0, "past tokens (", g.S, ") must be a multiple of page_tokens (", g.P, ")");
  TORCH_CHECK(selection.dim() == 3 && selection.size(0) == g.n_tiles && selection.size(1) == g.Hkv &&
                  selection.scalar_type() == at::kLong && selection.device() == q.device(),
              "selection: expected int64 [", g.n_tiles, ", ", g.Hkv, ", n] on ", q.device(), ", got ",
              selection.scalar_type(), " ", selection.sizes(), " on ", selection.device());
  g.n_sel = selection.size(2);
  TORCH_CHECK(g.n_sel == 0 || past != nullptr, "selection: ", g.n_sel, " pages a tile but no past");
  g.scale = 1.0 / std::sqrt(static_cast<double>(g.D));
  return g;
}

// The selected pages' keys and values, [n_tiles, Hkv, n_sel * P, D] each (empty without past).
std::pair<at::Tensor, at::Tensor> Gather(const Geometry& g, SparsePast* past, const at::Tensor& selection,
                                         const at::TensorOptions& options) {
  if (g.n_sel == 0) {
    const at::Tensor none = at::empty({g.n_tiles, g.Hkv, 0, g.D}, options);
    return {none, none};
  }
  auto [k, v] = past->GatherPages(selection);
  TORCH_CHECK(k.sizes() == at::IntArrayRef({g.n_tiles, g.Hkv, g.PastKeys(), g.D}) && v.sizes() == k.sizes(),
              "SparsePast::GatherPages: expected [", g.n_tiles, ", ", g.Hkv, ", ", g.PastKeys(), ", ", g.D, "], got ",
              k.sizes(), " and ", v.sizes());
  return {k.to(options.dtype()), v.to(options.dtype())};
}

// The fused path's conditions (see the header).
bool Fused(const at::Tensor& q, const at::Tensor& doc_start_cpu) {
  if (!q.is_cuda() || (q.scalar_type() != at::kBFloat16 && q.scalar_type() != at::kHalf)) return false;
  if (q.size(2) % 8 != 0 || q.size(2) > 256) return false;
  return doc_start_cpu.eq(0).all().item<bool>();
}

// ---- Reference ---------------------------------------------------------------------------

// Global positions of the keys tile t's queries see, [Hkv, n_sel * P + End(t)]: the selected
// pages' tokens (-1 for none: below every document start, so masked), then the chunk's prefix.
at::Tensor KeyPositions(const Geometry& g, const at::Tensor& selection, int64_t t) {
  const auto opts = selection.options();
  const at::Tensor sel = selection[t];  // [Hkv, n_sel]
  at::Tensor pos = (sel.unsqueeze(-1) * g.P + at::arange(g.P, opts)).masked_fill_(sel.unsqueeze(-1) < 0, -1);
  return at::cat({pos.reshape({g.Hkv, g.PastKeys()}), at::arange(g.S, g.S + g.End(t), opts).expand({g.Hkv, g.End(t)})},
                 1);
}

// Masked scores of tile t's queries qb [Hkv, G * B, D] against keys [Hkv, K, D]: [Hkv, G * B, K].
at::Tensor TileScores(const Geometry& g, int64_t t, const at::Tensor& qb, const at::Tensor& keys,
                      const at::Tensor& selection, const at::Tensor& doc_start) {
  const int64_t i0 = g.Begin(t), i1 = g.End(t), B = i1 - i0, K = keys.size(1);
  const at::Tensor j = KeyPositions(g, selection, t).unsqueeze(1);  // [Hkv, 1, K]
  const at::Tensor qi = at::arange(g.S + i0, g.S + i1, doc_start.options()).view({1, B, 1});
  const at::Tensor ds = doc_start.slice(0, i0, i1).view({1, B, 1});
  const at::Tensor blocked = ((j < ds) | (j > qi)).unsqueeze(1).expand({g.Hkv, g.G, B, K}).reshape({g.Hkv, g.G * B, K});
  return Matmul(qb, keys.transpose(1, 2)).mul_(g.scale).masked_fill_(blocked, kNegInf);
}

// Tile t's keys (or values): its selected pages, then the chunk's first End(t) tokens.
at::Tensor TileKeys(const Geometry& g, int64_t t, const at::Tensor& paged, const at::Tensor& chunk) {
  return at::cat({paged[t], chunk.slice(1, 0, g.End(t))}, 1);
}

// ---- Fused (the kernels of fused_attention.h) -----------------------------------------------
//
// Two key blocks merged by log-sum-exp: the past, as a batch of the n_tiles query tiles
// [P, Hq, D], each against its own selected pages [Hkv, n_sel * P, D] (every query of a tile
// sees every selected key), and the chunk, its queries against its own keys (causal).

// [C, ...] -> [n_tiles, P, ...], the rows past C zero (they add nothing to dK / dV: their
// dout is zero too).
at::Tensor ToTiles(const Geometry& g, const at::Tensor& x) {
  std::vector<int64_t> tiled = x.sizes().vec();
  tiled[0] = g.P;
  tiled.insert(tiled.begin(), g.n_tiles);
  if (g.n_tiles * g.P == g.C) return x.reshape(tiled);
  std::vector<int64_t> padded = x.sizes().vec();
  padded[0] = g.n_tiles * g.P;
  at::Tensor y = at::zeros(padded, x.options());
  y.slice(0, 0, g.C).copy_(x);
  return y.view(tiled);
}

// [n_tiles, P, ...] -> [C, ...]
at::Tensor FromTiles(const Geometry& g, const at::Tensor& x) { return x.flatten(0, 1).slice(0, 0, g.C); }

// A batch of query tiles [n_tiles, P, Hq, D] with each KV head's G query heads stacked as rows,
// [n_tiles, G * P, Hkv, D] (row g * P + i: query i of head h * G + g), and back; the
// log-sum-exp [n_tiles, Hq, P] is then [n_tiles, Hkv, G * P]. Every query of a tile sees every
// key of the past block (no mask), so the rows' order is free. The backward kernel runs all
// query rows against each block of keys: stacked, it meets G * P rows per key block instead
// of P, and runs at the rate of one large query block. The forward kernel is a little faster
// unstacked, so only backward stacks.
at::Tensor StackGroups(const Geometry& g, const at::Tensor& x) {
  return x.view({g.n_tiles, g.P, g.Hkv, g.G, g.D}).permute({0, 3, 1, 2, 4}).reshape({g.n_tiles, g.G * g.P, g.Hkv, g.D});
}
at::Tensor UnstackGroups(const Geometry& g, const at::Tensor& x) {
  return x.view({g.n_tiles, g.G, g.P, g.Hkv, g.D}).permute({0, 2, 3, 1, 4}).reshape({g.n_tiles, g.P, g.Hq, g.D});
}
at::Tensor StackGroupsLse(const Geometry& g, const at::Tensor& lse) {
  return lse.reshape({g.n_tiles, g.Hkv, g.G * g.P});
}

// The chunk's log-sum-exp [1, Hq, C] -> per tile [n_tiles, Hq, P] (zero past C), and back.
at::Tensor LseToTiles(const Geometry& g, const at::Tensor& lse) {
  at::Tensor padded = at::zeros({g.Hq, g.n_tiles * g.P}, lse.options());
  padded.slice(1, 0, g.C).copy_(lse[0]);
  return padded.view({g.Hq, g.n_tiles, g.P}).permute({1, 0, 2}).contiguous();
}
at::Tensor LseFromTiles(const Geometry& g, const at::Tensor& lse) {
  return lse.permute({1, 0, 2}).reshape({g.Hq, g.n_tiles * g.P}).slice(1, 0, g.C).unsqueeze(0);
}

// The chunk's own keys or values [C, Hkv, D] as one block [1, Hkv, C, D].
at::Tensor ChunkBlock(const at::Tensor& x) { return x.permute({1, 0, 2}).unsqueeze(0); }

class SparseAttentionFn : public torch::autograd::Function<SparseAttentionFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& doc_start, std::shared_ptr<SparsePast> past, const at::Tensor& selection,
                            int64_t page_tokens, GpuAttentionKernel kernel, const at::Tensor& sinks_argument) {
    const at::Tensor sinks = SinksOrNone(sinks_argument);
    const Geometry g = Check(q, k, v, doc_start, past.get(), selection, page_tokens);
    CheckSinks(sinks, q);
    ctx->saved_data["sinks"] = sinks;
    ctx->saved_data["past"] = c10::IValue::make_capsule(c10::make_intrusive<PastHolder>(past));
    ctx->saved_data["page_tokens"] = page_tokens;
    if (Fused(q, doc_start.cpu())) {  // no wait for a CPU doc_start
      const GpuAttentionKernel fused = FusedKernel(q, kernel);
      at::Tensor out, lse;  // float32 [1, C, Hq, D] (q's dtype after the chunk's block), [1, Hq, C]
      if (g.n_sel > 0) {
        timeline::Mark("sparse.gather");
        auto [kp, vp] = Gather(g, past.get(), selection, q.options());
        timeline::Mark("sparse.past_kernel_fwd");
        const FusedBlock r = FusedBlockForward(fused, ToTiles(g, q), kp, vp, /*causal=*/false, g.scale);
        timeline::Mark("sparse.merge");
        MergeFusedBlock(&out, &lse, FromTiles(g, r.out).unsqueeze(0), LseFromTiles(g, r.lse));
      }
      timeline::Mark("sparse.chunk_kernel_fwd");
      const FusedBlock chunk =
          FusedBlockForward(fused, q.unsqueeze(0), ChunkBlock(k), ChunkBlock(v), /*causal=*/true, g.scale);
      timeline::Mark("sparse.merge");
      MergeFusedBlock(&out, &lse, chunk.out, chunk.lse, sinks.defined() ? at::kFloat : q.scalar_type());
      if (sinks.defined()) {
        out.mul_(FoldSinks(lse, sinks.to(at::kFloat).view({1, g.Hq, 1})).transpose(1, 2).unsqueeze(-1));
      }
      out = out.to(q.scalar_type());
      ctx->save_for_backward({q, k, v, doc_start, selection, out, lse, chunk.aux[0], chunk.aux[1]});
      ctx->saved_data["fused_kernel"] = static_cast<int64_t>(fused);
      timeline::Mark("sparse.prefetch");
      if (past != nullptr) past->Finished(/*backward=*/false);
      timeline::Mark("model");
      return out.squeeze(0);
    }
    const at::ScalarType ct = AttentionComputeType(q.scalar_type());
    const at::Tensor qg = g.ToGrouped(q.to(ct));
    const at::Tensor kc = k.to(ct).permute({1, 0, 2}), vc = v.to(ct).permute({1, 0, 2});  // [Hkv, C, D]
    const at::Tensor doc = Upload(doc_start, q.device());
    auto [kp, vp] = Gather(g, past.get(), selection, qg.options());
    at::Tensor out = at::empty({g.Hkv, g.G, g.C, g.D}, qg.options());
    at::Tensor lse = at::empty({g.Hkv, g.G, g.C}, qg.options());
    for (int64_t t = 0; t < g.n_tiles; ++t) {
      const int64_t i0 = g.Begin(t), i1 = g.End(t), B = i1 - i0;
      const at::Tensor qb = qg.slice(2, i0, i1).reshape({g.Hkv, g.G * B, g.D});
      const at::Tensor scores = TileScores(g, t, qb, TileKeys(g, t, kp, kc), selection, doc);
      const at::Tensor lb = at::logsumexp(scores, -1, /*keepdim=*/true);
      out.slice(2, i0, i1).copy_(Matmul(at::exp(scores - lb), TileKeys(g, t, vp, vc)).view({g.Hkv, g.G, B, g.D}));
      lse.slice(2, i0, i1).copy_(lb.view({g.Hkv, g.G, B}));
    }
    if (sinks.defined()) out.mul_(FoldSinks(lse, sinks.to(ct).view({g.Hkv, g.G, 1})).unsqueeze(-1));
    ctx->save_for_backward({q, k, v, doc, selection, out, lse});
    if (past != nullptr) past->Finished(/*backward=*/false);
    return g.FromGrouped(out).to(q.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &doc_start = saved[3], &selection = saved[4],
                     &out = saved[5], &lse = saved[6];
    auto holder = c10::static_intrusive_pointer_cast<PastHolder>(ctx->saved_data["past"].toCapsule());
    SparsePast* past = holder->past.get();
    const Geometry g = Check(q, k, v, doc_start, past, selection, ctx->saved_data["page_tokens"].toInt());
    at::Tensor dq, dk, dv, dkp, dvp;
    const at::Tensor sinks = ctx->saved_data["sinks"].toTensor();
    at::Tensor dsinks;
    if (ctx->saved_data.count("fused_kernel")) {
      const auto fused = static_cast<GpuAttentionKernel>(ctx->saved_data["fused_kernel"].toInt());
      const std::array<at::Tensor, 2> aux = {saved[7], saved[8]};
      timeline::Mark("sparse.chunk_kernel_bwd");
      const at::Tensor dout = grad_outputs[0].contiguous();
      if (sinks.defined()) {
        const at::Tensor di = (dout.to(at::kFloat) * out[0].to(at::kFloat)).sum(-1).t().unsqueeze(0);  // [1, Hq, C]
        dsinks = SinkGradTerms(lse, sinks.to(at::kFloat).view({1, g.Hq, 1}), di).sum(at::IntArrayRef{0, 2});
      }
      auto [dq_chunk, dk_chunk, dv_chunk] = FusedBlockBackward(fused, dout.unsqueeze(0), q.unsqueeze(0), ChunkBlock(k),
                                                               ChunkBlock(v), out, lse, /*causal=*/true, aux, g.scale);
      dq = dq_chunk[0].to(at::kFloat);
      dk = dk_chunk[0].permute({1, 0, 2}).contiguous();
      dv = dv_chunk[0].permute({1, 0, 2}).contiguous();
      if (g.n_sel > 0) {
        timeline::Mark("sparse.gather_bwd");
        auto [kp, vp] = Gather(g, past, selection, q.options());
        timeline::Mark("sparse.past_kernel_bwd");
        const auto stacked = [&g](const at::Tensor& x) { return StackGroups(g, ToTiles(g, x)); };
        auto [dq_past, dk_past, dv_past] =
            FusedBlockBackward(fused, stacked(dout), stacked(q), kp, vp, stacked(out[0]),
                               StackGroupsLse(g, LseToTiles(g, lse)), /*causal=*/false, aux, g.scale);
        dq.add_(FromTiles(g, UnstackGroups(g, dq_past)));
        dkp = std::move(dk_past);
        dvp = std::move(dv_past);
      }
      dq = dq.to(q.scalar_type());
    } else {
      const at::ScalarType ct = AttentionComputeType(q.scalar_type());
      const at::Tensor qg = g.ToGrouped(q.to(ct));
      const at::Tensor kc = k.to(ct).permute({1, 0, 2}), vc = v.to(ct).permute({1, 0, 2});
      auto [kp, vp] = Gather(g, past, selection, qg.options());
      const at::Tensor dog = g.ToGrouped(grad_outputs[0].to(ct));
      const at::Tensor di = (dog * out).sum(-1);  // [Hkv, G, C]
      if (sinks.defined()) {
        dsinks = SinkGradTerms(lse, sinks.to(ct).view({g.Hkv, g.G, 1}), di).sum(-1).reshape({g.Hq});
      }
      at::Tensor dqg = at::empty_like(qg);
      at::Tensor dkc = at::zeros_like(kc), dvc = at::zeros_like(vc);
      dkp = at::empty_like(kp);
      dvp = at::empty_like(vp);
      for (int64_t t = 0; t < g.n_tiles; ++t) {
        const int64_t i0 = g.Begin(t), i1 = g.End(t), B = i1 - i0, R = g.G * B;
        const at::Tensor qb = qg.slice(2, i0, i1).reshape({g.Hkv, R, g.D});
        const at::Tensor dob = dog.slice(2, i0, i1).reshape({g.Hkv, R, g.D});
        const at::Tensor keys = TileKeys(g, t, kp, kc), values = TileKeys(g, t, vp, vc);
        const at::Tensor p =
            at::exp(TileScores(g, t, qb, keys, selection, doc_start) - lse.slice(2, i0, i1).reshape({g.Hkv, R, 1}));
        const at::Tensor ds = p * (Matmul(dob, values.transpose(1, 2)) - di.slice(2, i0, i1).reshape({g.Hkv, R, 1}));
        dqg.slice(2, i0, i1).copy_(Matmul(ds, keys).mul_(g.scale).view({g.Hkv, g.G, B, g.D}));
        const at::Tensor dkeys = Matmul(ds.transpose(1, 2), qb).mul_(g.scale);
        const at::Tensor dvalues = Matmul(p.transpose(1, 2), dob);
        dkp[t].copy_(dkeys.slice(1, 0, g.PastKeys()));
        dvp[t].copy_(dvalues.slice(1, 0, g.PastKeys()));
        dkc.slice(1, 0, i1).add_(dkeys.slice(1, g.PastKeys()));
        dvc.slice(1, 0, i1).add_(dvalues.slice(1, g.PastKeys()));
      }
      dq = g.FromGrouped(dqg).to(q.scalar_type());
      dk = dkc.permute({1, 0, 2}).to(k.scalar_type()).contiguous();
      dv = dvc.permute({1, 0, 2}).to(v.scalar_type()).contiguous();
    }
    timeline::Mark("sparse.grad_accumulate");
    if (g.n_sel > 0) past->AccumulatePageGrad(selection, dkp, dvp);
    timeline::Mark("sparse.prefetch");
    if (past != nullptr) past->Finished(/*backward=*/true);
    timeline::Mark("model");
    if (dsinks.defined()) dsinks = dsinks.to(sinks.scalar_type());
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), dsinks};
  }
};

}  // namespace

at::Tensor SparsePagedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& doc_start, std::shared_ptr<SparsePast> past,
                                const at::Tensor& selection, int64_t page_tokens, GpuAttentionKernel kernel,
                                const at::Tensor& sinks) {
  return SparseAttentionFn::apply(q, k, v, doc_start, std::move(past), selection, page_tokens, kernel,
                                  SinksArgument(sinks));
}

}  // namespace oomb::kernels
