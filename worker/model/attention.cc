#include "worker/model/attention.h"

#include "worker/model/rope.h"

namespace oomb {

std::array<at::Tensor, 3> AttentionBlock::Inputs(const BlockContext& ctx, const LayerSpec& spec, const at::Tensor& x,
                                                 const at::Tensor& cos, const at::Tensor& sin, at::Generator* gen,
                                                 bool training) const {
  const int64_t C = x.size(0);
  const int64_t H = ctx.local_heads(), Hkv = ctx.local_kv_heads(), D = ctx.config.head_dim;
  at::Tensor qt, kt, vt;
  if (spec.fused_projections) {  // one product, split into views as transformers does
    const auto parts = qkv.Forward(ctx, x, gen, training).split_with_sizes({H * D, Hkv * D, Hkv * D}, -1);
    qt = parts[0].view({C, H, D});
    kt = parts[1].view({C, Hkv, D});
    // A copy: the attention saves v, and a view would keep the whole [C, q + 2 kv] product alive.
    vt = parts[2].contiguous().view({C, Hkv, D});
  } else {
    qt = q.Forward(ctx, x, gen, training).view({C, H, D});
    kt = k.Forward(ctx, x, gen, training).view({C, Hkv, D});
    vt = v.Forward(ctx, x, gen, training).view({C, Hkv, D});
  }
  if (spec.Has(NormRole::kQuery)) {  // per head, before RoPE
    qt = ctx.Norm(qt, q_norm);
    kt = ctx.Norm(kt, k_norm);
  }
  qt = RotateHeads(ctx.config, qt, cos, sin);
  kt = RotateHeads(ctx.config, kt, cos, sin);
  if (ctx.spec.query_scale != 1.0) qt = qt * ctx.spec.query_scale;  // the attention scales by head_dim^-1/2
  return {qt, kt, vt};
}

at::Tensor AttentionBlock::Output(const BlockContext& ctx, const at::Tensor& attention, at::Generator* gen,
                                  bool training) const {
  const at::Tensor attn = attention.reshape({attention.size(0), ctx.local_heads() * ctx.config.head_dim});
  return o.Forward(ctx, attn, gen, training);
}

}  // namespace oomb
