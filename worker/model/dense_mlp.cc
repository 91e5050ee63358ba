#include "worker/model/dense_mlp.h"

#include "kernels/torch/layer_ops.h"

namespace oomb {

at::Tensor DenseMlp::Forward(const BlockContext& ctx, const LayerSpec& spec, const at::Tensor& y, at::Generator* gen,
                             bool training) const {
  at::Tensor g, u;
  if (spec.fused_projections) {  // gate's rows first
    const auto parts = gate_up.Forward(ctx, y, gen, training).chunk(2, -1);
    g = parts[0];
    u = parts[1];
  } else {
    g = gate.Forward(ctx, y, gen, training);
    u = up.Forward(ctx, y, gen, training);
  }
  const bool gelu = spec.mlp == MlpKind::kGeluTanhGlu;
  if (down.lora_a.defined() && (!down.bias.defined() || !ctx.LeadsGroup()) && !down.weight.requires_grad() &&
      (down.lora_dropout == 0 || !training)) {
    // The same values as down.Forward's, keeping one intermediate-wide tensor less for backward.
    const at::ScalarType t = g.scalar_type();
    return ctx.SumShards(kernels::GluDownLora(gelu ? kernels::GluKind::kGeluTanh : kernels::GluKind::kSilu, g, u,
                                              down.weight, down.lora_a.to(t), (down.lora_b * down.lora_scaling).to(t)));
  }
  const at::Tensor act = gelu ? kernels::GeluTanhGlu(g, u) : kernels::SwiGlu(g, u);
  return down.Forward(ctx, act, gen, training);
}

}  // namespace oomb
