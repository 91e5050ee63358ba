// Matrix products for every layer and kernel: at::matmul / at::linear / mm_out / addmm_, except where
// PyTorch has no fast path for them.
//
// PyTorch multiplies bfloat16 matrices on a CPU through oneDNN only where the CPU has the
// AVX-512 core set (or AMX); elsewhere (an AVX2-only x86 CPU, for example) it takes a scalar
// reference loop, measured ~200x slower than float32 on the same CPU. There, bfloat16 CPU
// operands are multiplied in float32 and the product is rounded to bfloat16 once — what both
// PyTorch paths compute too (float32 accumulation, one rounding), up to the order of the
// additions. Every other case — a GPU, float32, a CPU with the fast path — calls PyTorch's op
// unchanged. Matmul, Linear and AddMatmul_ are differentiable through autograd as PyTorch's ops are.
#ifndef OOMB_KERNELS_TORCH_MATMUL_H_
#define OOMB_KERNELS_TORCH_MATMUL_H_

#include <ATen/core/Tensor.h>

#include <optional>

namespace oomb::kernels {

// Whether this CPU multiplies bfloat16 matrices natively (through oneDNN); decided once.
bool CpuHasFastBf16Matmul();

// at::matmul(a, b).
at::Tensor Matmul(const at::Tensor& a, const at::Tensor& b);

// at::linear(x, weight, bias): x weight^T + bias.
at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias = std::nullopt);

// out = a b for 2-D out [M, N], a [M, K], b [K, N], written into out (at::mm_out).
void MatmulOut(at::Tensor& out, const at::Tensor& a, const at::Tensor& b);

// y += a b for 2-D y [M, N], a [M, K], b [K, N], in place (y.addmm_(a, b)), rounded once.
void AddMatmul_(at::Tensor& y, const at::Tensor& a, const at::Tensor& b);

// Grouped products (at::_grouped_mm, differentiable through its autograd): a [M, K] whose rows
// come in G groups, group g's rows [offs[g-1], offs[g]) (offs [G] int32, cumulative, on a's
// device; empty groups allowed), each times b[g] ([G, K, N], taken as PyTorch's grouped GEMM
// takes it: b[g] column-major, b.stride(1) == 1, as a transposed [G, N, K] tensor is) -> [M, N].
// One kernel for every group on a GPU, with no host synchronisation; PyTorch's loop on a CPU.
at::Tensor GroupedMatmul(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs);

// Whether GroupedMatmul takes operands of this dtype with these inner sizes (K, N and every
// other size the products' operands and gradients have in their rows): float32, bfloat16 or
// float16 with rows of a multiple of 16 bytes.
bool GroupedMatmulTakes(at::ScalarType dtype, at::IntArrayRef sizes);

// Whether GroupedMatmul runs as one kernel on `device`: a GPU of compute capability 9.0 or more.
bool GroupedMatmulIsNative(const at::Device& device);

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_TORCH_MATMUL_H_
