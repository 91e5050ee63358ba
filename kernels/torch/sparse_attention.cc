#include "kernels/torch/sparse_attention.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/torch/attention_inputs.h"

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
  return at::matmul(qb, keys.transpose(1, 2)).mul_(g.scale).masked_fill_(blocked, kNegInf);
}

// Tile t's keys (or values): its selected pages, then the chunk's first End(t) tokens.
at::Tensor TileKeys(const Geometry& g, int64_t t, const at::Tensor& paged, const at::Tensor& chunk) {
  return at::cat({paged[t], chunk.slice(1, 0, g.End(t))}, 1);
}

// ---- Fused (flash attention, variable-length batch of (tile, KV head) sequences) -----------

struct Packed {
  at::Tensor q;     // [sum_t Hkv * B_t, G, D]
  at::Tensor k, v;  // [sum_t Hkv * (n_sel * P + End(t)), 1, D]
  at::Tensor cu_q;  // [n_tiles * Hkv + 1] int32
  at::Tensor cu_k;
  int64_t max_q = 0, max_k = 0;
};

// [C, Hq, D] -> [sum_t Hkv * B_t, G, D]: tile by tile, KV head by KV head.
at::Tensor PackQueries(const Geometry& g, const at::Tensor& x) {
  std::vector<at::Tensor> parts;
  const at::Tensor x4 = x.reshape({g.C, g.Hkv, g.G, g.D});
  for (int64_t t = 0; t < g.n_tiles; ++t) {
    parts.push_back(x4.slice(0, g.Begin(t), g.End(t)).permute({1, 0, 2, 3}).reshape({-1, g.G, g.D}));
  }
  return at::cat(parts, 0);
}

// The inverse of PackQueries.
at::Tensor UnpackQueries(const Geometry& g, const at::Tensor& packed) {
  std::vector<at::Tensor> parts;
  int64_t offset = 0;
  for (int64_t t = 0; t < g.n_tiles; ++t) {
    const int64_t B = g.End(t) - g.Begin(t);
    parts.push_back(packed.slice(0, offset, offset + g.Hkv * B)
                        .view({g.Hkv, B, g.G, g.D})
                        .permute({1, 0, 2, 3})
                        .reshape({B, g.Hq, g.D}));
    offset += g.Hkv * B;
  }
  return at::cat(parts, 0);
}

Packed Pack(const Geometry& g, const at::Tensor& q, const at::Tensor& kp, const at::Tensor& vp, const at::Tensor& k,
            const at::Tensor& v) {
  Packed p;
  p.q = PackQueries(g, q);
  const at::Tensor kc = k.permute({1, 0, 2}), vc = v.permute({1, 0, 2});  // [Hkv, C, D]
  std::vector<at::Tensor> ks, vs;
  std::vector<int32_t> cu_q = {0}, cu_k = {0};
  for (int64_t t = 0; t < g.n_tiles; ++t) {
    const int64_t keys = g.PastKeys() + g.End(t);
    ks.push_back(TileKeys(g, t, kp, kc).reshape({g.Hkv * keys, 1, g.D}));
    vs.push_back(TileKeys(g, t, vp, vc).reshape({g.Hkv * keys, 1, g.D}));
    for (int64_t h = 0; h < g.Hkv; ++h) {
      cu_q.push_back(cu_q.back() + static_cast<int32_t>(g.End(t) - g.Begin(t)));
      cu_k.push_back(cu_k.back() + static_cast<int32_t>(keys));
    }
    p.max_q = std::max(p.max_q, g.End(t) - g.Begin(t));
    p.max_k = std::max(p.max_k, keys);
  }
  p.k = at::cat(ks, 0);
  p.v = at::cat(vs, 0);
  p.cu_q = at::tensor(cu_q, at::kInt).to(q.device());
  p.cu_k = at::tensor(cu_k, at::kInt).to(q.device());
  return p;
}

class SparseAttentionFn : public torch::autograd::Function<SparseAttentionFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& doc_start, std::shared_ptr<SparsePast> past, const at::Tensor& selection,
                            int64_t page_tokens) {
    const Geometry g = Check(q, k, v, doc_start, past.get(), selection, page_tokens);
    ctx->saved_data["past"] = c10::IValue::make_capsule(c10::make_intrusive<PastHolder>(past));
    ctx->saved_data["page_tokens"] = page_tokens;
    if (Fused(q, doc_start.cpu())) {
      auto [kp, vp] = Gather(g, past.get(), selection, q.options());
      const Packed p = Pack(g, q, kp, vp, k, v);
      auto [out, lse, rng, unused, mask] =
          at::_flash_attention_forward(p.q, p.k, p.v, p.cu_q, p.cu_k, p.max_q, p.max_k, 0.0, /*is_causal=*/true,
                                       /*return_debug_mask=*/false, g.scale);
      ctx->save_for_backward({q, k, v, doc_start, selection, out, lse, rng, unused});
      ctx->saved_data["fused"] = true;
      return UnpackQueries(g, out);
    }
    const at::ScalarType ct = AttentionComputeType(q.scalar_type());
    const at::Tensor qg = g.ToGrouped(q.to(ct));
    const at::Tensor kc = k.to(ct).permute({1, 0, 2}), vc = v.to(ct).permute({1, 0, 2});  // [Hkv, C, D]
    auto [kp, vp] = Gather(g, past.get(), selection, qg.options());
    at::Tensor out = at::empty({g.Hkv, g.G, g.C, g.D}, qg.options());
    at::Tensor lse = at::empty({g.Hkv, g.G, g.C}, qg.options());
    for (int64_t t = 0; t < g.n_tiles; ++t) {
      const int64_t i0 = g.Begin(t), i1 = g.End(t), B = i1 - i0;
      const at::Tensor qb = qg.slice(2, i0, i1).reshape({g.Hkv, g.G * B, g.D});
      const at::Tensor scores = TileScores(g, t, qb, TileKeys(g, t, kp, kc), selection, doc_start);
      const at::Tensor lb = at::logsumexp(scores, -1, /*keepdim=*/true);
      out.slice(2, i0, i1).copy_(at::matmul(at::exp(scores - lb), TileKeys(g, t, vp, vc)).view({g.Hkv, g.G, B, g.D}));
      lse.slice(2, i0, i1).copy_(lb.view({g.Hkv, g.G, B}));
    }
    ctx->save_for_backward({q, k, v, doc_start, selection, out, lse});
    return g.FromGrouped(out).to(q.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &doc_start = saved[3], &selection = saved[4],
                     &out = saved[5], &lse = saved[6];
    auto holder = c10::static_intrusive_pointer_cast<PastHolder>(ctx->saved_data["past"].toCapsule());
    SparsePast* past = holder->past.get();
    const Geometry g = Check(q, k, v, doc_start, past, selection, ctx->saved_data["page_tokens"].toInt());
    const at::ScalarType acc = AttentionComputeType(q.scalar_type());
    at::Tensor dq, dk, dv, dkp, dvp;
    if (ctx->saved_data.count("fused")) {
      auto [kp, vp] = Gather(g, past, selection, q.options());
      const Packed p = Pack(g, q, kp, vp, k, v);
      auto [dqp, dkpk, dvpk] =
          at::_flash_attention_backward(PackQueries(g, grad_outputs[0].contiguous()), p.q, p.k, p.v, out, lse, p.cu_q,
                                        p.cu_k, p.max_q, p.max_k, 0.0, /*is_causal=*/true, saved[7], saved[8], g.scale);
      dq = UnpackQueries(g, dqp);
      // Split each tile's key gradients into its pages' and the chunk prefix's.
      dkp = at::empty({g.n_tiles, g.Hkv, g.PastKeys(), g.D}, q.options().dtype(acc));
      dvp = at::empty_like(dkp);
      at::Tensor dkc = at::zeros({g.Hkv, g.C, g.D}, q.options().dtype(acc)), dvc = at::zeros_like(dkc);
      int64_t offset = 0;
      for (int64_t t = 0; t < g.n_tiles; ++t) {
        const int64_t keys = g.PastKeys() + g.End(t);
        const at::Tensor kt = dkpk.slice(0, offset, offset + g.Hkv * keys).view({g.Hkv, keys, g.D});
        const at::Tensor vt = dvpk.slice(0, offset, offset + g.Hkv * keys).view({g.Hkv, keys, g.D});
        dkp[t].copy_(kt.slice(1, 0, g.PastKeys()));
        dvp[t].copy_(vt.slice(1, 0, g.PastKeys()));
        dkc.slice(1, 0, g.End(t)).add_(kt.slice(1, g.PastKeys()));
        dvc.slice(1, 0, g.End(t)).add_(vt.slice(1, g.PastKeys()));
        offset += g.Hkv * keys;
      }
      dk = dkc.permute({1, 0, 2}).to(k.scalar_type()).contiguous();
      dv = dvc.permute({1, 0, 2}).to(v.scalar_type()).contiguous();
    } else {
      const at::ScalarType ct = AttentionComputeType(q.scalar_type());
      const at::Tensor qg = g.ToGrouped(q.to(ct));
      const at::Tensor kc = k.to(ct).permute({1, 0, 2}), vc = v.to(ct).permute({1, 0, 2});
      auto [kp, vp] = Gather(g, past, selection, qg.options());
      const at::Tensor dog = g.ToGrouped(grad_outputs[0].to(ct));
      const at::Tensor di = (dog * out).sum(-1);  // [Hkv, G, C]
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
        const at::Tensor ds =
            p * (at::matmul(dob, values.transpose(1, 2)) - di.slice(2, i0, i1).reshape({g.Hkv, R, 1}));
        dqg.slice(2, i0, i1).copy_(at::matmul(ds, keys).mul_(g.scale).view({g.Hkv, g.G, B, g.D}));
        const at::Tensor dkeys = at::matmul(ds.transpose(1, 2), qb).mul_(g.scale);
        const at::Tensor dvalues = at::matmul(p.transpose(1, 2), dob);
        dkp[t].copy_(dkeys.slice(1, 0, g.PastKeys()));
        dvp[t].copy_(dvalues.slice(1, 0, g.PastKeys()));
        dkc.slice(1, 0, i1).add_(dkeys.slice(1, g.PastKeys()));
        dvc.slice(1, 0, i1).add_(dvalues.slice(1, g.PastKeys()));
      }
      dq = g.FromGrouped(dqg).to(q.scalar_type());
      dk = dkc.permute({1, 0, 2}).to(k.scalar_type()).contiguous();
      dv = dvc.permute({1, 0, 2}).to(v.scalar_type()).contiguous();
    }
    if (g.n_sel > 0) past->AccumulatePageGrad(selection, dkp.to(acc), dvp.to(acc));
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor SparsePagedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& doc_start, std::shared_ptr<SparsePast> past,
                                const at::Tensor& selection, int64_t page_tokens) {
  return SparseAttentionFn::apply(q, k, v, doc_start, std::move(past), selection, page_tokens);
}

}  // namespace oomb::kernels
