#include "kernels/torch/fused_attention.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <optional>

#include "kernels/layer_ops.h"

namespace oomb::kernels {

GpuAttentionKernel FusedKernel(const at::Tensor& q, GpuAttentionKernel asked) {
  if (asked != GpuAttentionKernel::kCudnn || q.size(-1) > 256 || !at::globalContext().userEnabledCuDNN()) {
    return GpuAttentionKernel::kFlash;
  }
  return at::cuda::getDeviceProperties(q.get_device())->major >= 9 ? GpuAttentionKernel::kCudnn
                                                                   : GpuAttentionKernel::kFlash;
}

namespace {

std::optional<int64_t> Bound(int64_t w) { return w >= 0 ? std::optional<int64_t>(w) : std::nullopt; }

}  // namespace

FusedBlock FusedBlockForward(GpuAttentionKernel kernel, const at::Tensor& q, const at::Tensor& keys,
                             const at::Tensor& values, bool causal, double scale, LocalWindow window) {
  TORCH_CHECK(q.dim() == 4 && keys.dim() == 4 && values.sizes() == keys.sizes() && keys.size(0) == q.size(0),
              "fused attention: expected q [B, Cq, H, D] and keys, values [B, Hkv, n, D], got ", q.sizes(), ", ",
              keys.sizes(), ", ", values.sizes());
  const int64_t B = q.size(0), Cq = q.size(1), Hq = q.size(2), n = keys.size(2);
  TORCH_CHECK(!causal || n == Cq, "fused attention: a causal block needs as many keys as queries, got ", n, " and ",
              Cq);
  TORCH_CHECK(!window.any() || kernel == GpuAttentionKernel::kFlash,
              "fused attention: a window needs the flash kernel");
  if (kernel == GpuAttentionKernel::kCudnn) {
    // cuDNN takes [B, H, S, D] views of any strides and gives its output in q's layout.
    auto r = at::_scaled_dot_product_cudnn_attention(q.transpose(1, 2), keys, values, std::nullopt,
                                                     /*compute_log_sumexp=*/true, 0.0, causal,
                                                     /*return_debug_mask=*/false, scale);
    return {std::get<0>(r).transpose(1, 2), std::get<1>(r).reshape({B, Hq, Cq}), {std::get<6>(r), std::get<7>(r)}};
  }
  auto r = at::_flash_attention_forward(
      q.contiguous(), keys.permute({0, 2, 1, 3}).contiguous(), values.permute({0, 2, 1, 3}).contiguous(), std::nullopt,
      std::nullopt, Cq, n, 0.0, causal, /*return_debug_mask=*/false, scale, Bound(window.left), Bound(window.right));
  return {std::get<0>(r), std::get<1>(r), {std::get<2>(r), std::get<3>(r)}};
}

std::array<at::Tensor, 3> FusedBlockBackward(GpuAttentionKernel kernel, const at::Tensor& dout, const at::Tensor& q,
                                             const at::Tensor& keys, const at::Tensor& values, const at::Tensor& out,
                                             const at::Tensor& lse, bool causal, const std::array<at::Tensor, 2>& aux,
                                             double scale, LocalWindow window) {
  const int64_t Cq = q.size(1), n = keys.size(2);
  TORCH_CHECK(!window.any() || kernel == GpuAttentionKernel::kFlash,
              "fused attention: a window needs the flash kernel");
  if (kernel == GpuAttentionKernel::kCudnn) {
    auto [dq, dk, dv] = at::_scaled_dot_product_cudnn_attention_backward(
        dout.transpose(1, 2), q.transpose(1, 2), keys, values, out.transpose(1, 2), lse.unsqueeze(-1), aux[0], aux[1],
        at::Tensor(), at::Tensor(), at::Tensor(), Cq, n, 0.0, causal, scale);
    return {dq.transpose(1, 2), dk, dv};
  }
  auto [dq, dk, dv] = at::_flash_attention_backward(
      dout.contiguous(), q.contiguous(), keys.permute({0, 2, 1, 3}).contiguous(),
      values.permute({0, 2, 1, 3}).contiguous(), out.contiguous(), lse.contiguous(), at::Tensor(), at::Tensor(), Cq, n,
      0.0, causal, aux[0], aux[1], scale, Bound(window.left), Bound(window.right));
  return {dq, dk.permute({0, 2, 1, 3}), dv.permute({0, 2, 1, 3})};
}

namespace {

// The merge of MergeFusedBlock on the AttentionMerge kernel: false where it does not apply (then
// nothing is written).
bool MergeOnKernel(const at::Tensor& out, const at::Tensor& lse, const at::Tensor& block_out,
                   const at::Tensor& block_lse, const at::Tensor& merged, at::ScalarType result, at::Tensor* y) {
#if defined(OOMB_HAVE_CUDA)
  const at::ScalarType half = block_out.scalar_type();
  if (!block_out.is_cuda() || (half != at::kBFloat16 && half != at::kHalf) ||
      (out.scalar_type() != at::kFloat && out.scalar_type() != half) || (result != at::kFloat && result != half) ||
      out.sizes() != block_out.sizes() || block_out.dim() != 4 || lse.scalar_type() != at::kFloat ||
      block_lse.scalar_type() != at::kFloat) {
    return false;
  }
  const at::Tensor a = out.contiguous(), b = block_out.contiguous(), lse_a = lse.contiguous(),
                   lse_b = block_lse.contiguous();
  *y = at::empty(b.sizes(), b.options().dtype(result));
  AttentionMergeParams p;
  p.a = a.data_ptr();
  p.b = b.data_ptr();
  p.lse_a = lse_a.data_ptr<float>();
  p.lse_b = lse_b.data_ptr<float>();
  p.lse = merged.data_ptr<float>();
  p.out = y->data_ptr();
  p.batch = b.size(0);
  p.rows = b.size(1);
  p.heads = b.size(2);
  p.head_dim = b.size(3);
  p.a_f32 = a.scalar_type() == at::kFloat;
  p.out_f32 = result == at::kFloat;
  p.dtype = half == at::kBFloat16 ? HalfDtype::kBFloat16 : HalfDtype::kFloat16;
  const c10::cuda::CUDAGuard guard(b.device());
  const cudaError_t err = LaunchAttentionMerge(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "attention merge kernel: ", cudaGetErrorString(err));
  return true;
#else
  return false;
#endif
}

}  // namespace

void MergeFusedBlock(at::Tensor* out, at::Tensor* lse, const at::Tensor& block_out, const at::Tensor& block_lse,
                     at::ScalarType result) {
  if (!out->defined()) {
    *out = block_out.to(result);
    *lse = block_lse;
    return;
  }
  const at::Tensor merged = at::logaddexp(*lse, block_lse).contiguous();
  at::Tensor y;
  if (!MergeOnKernel(*out, *lse, block_out, block_lse, merged, result, &y)) {
    const at::Tensor w = at::exp(*lse - merged).transpose(1, 2).unsqueeze(-1);  // [B, Cq, H, 1]
    const at::Tensor w_b = at::exp(block_lse - merged).transpose(1, 2).unsqueeze(-1);
    y = (out->to(at::kFloat) * w + block_out.to(at::kFloat) * w_b).to(result);
  }
  *out = y;
  *lse = merged;
}

void MergeFusedRows(at::Tensor& out, at::Tensor& lse, int64_t rows, const at::Tensor& block_out,
                    const at::Tensor& block_lse) {
  at::Tensor o = out.slice(1, 0, rows), l = lse.slice(2, 0, rows);
  MergeFusedBlock(&o, &l, block_out, block_lse);
  out.slice(1, 0, rows).copy_(o);
  lse.slice(2, 0, rows).copy_(l);
}

}  // namespace oomb::kernels
