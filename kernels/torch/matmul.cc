#include "kernels/torch/matmul.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

namespace oomb::kernels {

bool CpuHasFastBf16Matmul() {
#if defined(__x86_64__)
  // oneDNN's avx512_core, which PyTorch's bfloat16 gemm asks for (AMX CPUs have it too).
  static const bool fast = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return fast;
#else
  return false;  // float32 products, correct on any CPU
#endif
}

namespace {

// Whether a product of these operands goes through float32 (the header's contract).
bool ViaFloat32(const at::Tensor& a) {
  return a.device().is_cpu() && a.scalar_type() == at::kBFloat16 && !CpuHasFastBf16Matmul();
}

}  // namespace

at::Tensor Matmul(const at::Tensor& a, const at::Tensor& b) {
  if (!ViaFloat32(a)) return at::matmul(a, b);
  return at::matmul(a.to(at::kFloat), b.to(at::kFloat)).to(at::kBFloat16);
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  if (!ViaFloat32(x)) return at::linear(x, weight, bias);
  std::optional<at::Tensor> b32;
  if (bias.has_value() && bias->defined()) b32 = bias->to(at::kFloat);
  return at::linear(x.to(at::kFloat), weight.to(at::kFloat), b32).to(at::kBFloat16);
}

void MatmulOut(at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  if (!ViaFloat32(out)) {
    at::mm_out(out, a, b);
    return;
  }
  out.copy_(at::mm(a.to(at::kFloat), b.to(at::kFloat)));
}

void AddMatmul_(at::Tensor& y, const at::Tensor& a, const at::Tensor& b) {
  if (!ViaFloat32(y)) {
    y.addmm_(a, b);
    return;
  }
  // The sum in float32, one rounding; autograd takes the copy's gradient to the sum's operands.
  y.copy_(at::addmm(y.to(at::kFloat), a.to(at::kFloat), b.to(at::kFloat)));
}

at::Tensor GroupedMatmul(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs) {
  return at::_grouped_mm(a, b, offs);
}

bool GroupedMatmulTakes(at::ScalarType dtype, at::IntArrayRef sizes) {
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) return false;
  const int64_t bytes = static_cast<int64_t>(c10::elementSize(dtype));
  for (const int64_t n : sizes) {
    if (n * bytes % 16 != 0) return false;
  }
  return true;
}

bool GroupedMatmulIsNative(const at::Device& device) {
  return device.is_cuda() && at::cuda::getDeviceProperties(device.index())->major >= 9;
}

}  // namespace oomb::kernels
