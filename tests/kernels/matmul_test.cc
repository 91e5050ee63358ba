// The matrix products of kernels/torch/matmul.h: on every CPU, bfloat16 products equal the
// float32 product of the same values rounded once (what PyTorch's own bfloat16 paths compute),
// their gradients are the float32 products' rounded, and float32 products are PyTorch's own
// bit for bit.
#include "kernels/torch/matmul.h"

#include <ATen/ATen.h>
#include <ATen/Version.h>
#include <gtest/gtest.h>

namespace oomb::kernels {
namespace {

at::Tensor Bf16(at::IntArrayRef sizes, int seed) {
  at::manual_seed(seed);
  return at::randn(sizes).to(at::kBFloat16);
}

// Whether x is y's float32 value rounded to bfloat16, allowing one unit in the last place for
// the order of the additions (float32 accumulates either way).
void ExpectRoundedOnce(const at::Tensor& x, const at::Tensor& y32) {
  ASSERT_EQ(x.scalar_type(), at::kBFloat16);
  const at::Tensor ulp = y32.abs().clamp_min(1e-3) * (1.0 / 128);
  EXPECT_TRUE((x.to(at::kFloat) - y32).abs().le(ulp).all().item<bool>())
      << "largest difference " << (x.to(at::kFloat) - y32).abs().max().item<float>();
}

TEST(MatmulTest, TheFastPathIsDecidedAsPyTorchDecidesIt) {
  // PyTorch's bfloat16 gemm asks oneDNN for avx512_core; its dispatch level says AVX512 exactly
  // where the CPU has those (unless ATEN_CPU_CAPABILITY lowers it).
  if (std::getenv("ATEN_CPU_CAPABILITY") != nullptr) GTEST_SKIP() << "ATEN_CPU_CAPABILITY is set";
  EXPECT_EQ(CpuHasFastBf16Matmul(), at::get_cpu_capability() == "AVX512") << at::get_cpu_capability();
}

TEST(MatmulTest, Bfloat16ProductsAreTheFloat32ProductsRoundedOnce) {
  const at::Tensor a = Bf16({37, 96}, 1), b = Bf16({96, 53}, 2), bias = Bf16({53}, 3);
  const at::Tensor a32 = a.to(at::kFloat), b32 = b.to(at::kFloat);
  ExpectRoundedOnce(Matmul(a, b), at::matmul(a32, b32));
  ExpectRoundedOnce(Matmul(a.view({1, 37, 96}), b), at::matmul(a32, b32).view({1, 37, 53}));
  ExpectRoundedOnce(Linear(a, b.t(), bias), at::linear(a32, b32.t(), bias.to(at::kFloat)));
  at::Tensor out = at::empty({37, 53}, a.options());
  MatmulOut(out, a, b);
  ExpectRoundedOnce(out, at::matmul(a32, b32));
  at::Tensor y = Bf16({37, 53}, 4);
  const at::Tensor y32 = y.to(at::kFloat);
  AddMatmul_(y, a, b);
  ExpectRoundedOnce(y, at::addmm(y32, a32, b32));
}

TEST(MatmulTest, GradientsFlowToEveryOperand) {
  at::Tensor x = Bf16({9, 32}, 5).requires_grad_(true), w = Bf16({16, 32}, 6).requires_grad_(true);
  at::Tensor a = Bf16({32, 4}, 7).requires_grad_(true), b = Bf16({4, 16}, 8).requires_grad_(true);
  at::Tensor y = Linear(x, w);
  AddMatmul_(y, Matmul(x, a), b);
  const at::Tensor dy = Bf16({9, 16}, 9);
  y.backward(dy);
  // The same sums in float32: y = x w^T + (x a) b.
  const at::Tensor x32 = x.detach().to(at::kFloat), w32 = w.detach().to(at::kFloat);
  const at::Tensor a32 = a.detach().to(at::kFloat), b32 = b.detach().to(at::kFloat), dy32 = dy.to(at::kFloat);
  const at::Tensor xa = at::matmul(x32, a32).to(at::kBFloat16).to(at::kFloat);  // rounded as forward keeps it
  ExpectRoundedOnce(w.grad(), at::matmul(dy32.t(), x32));
  ExpectRoundedOnce(b.grad(), at::matmul(xa.t(), dy32));
  const at::Tensor dxa = at::matmul(dy32, b32.t()).to(at::kBFloat16).to(at::kFloat);
  ExpectRoundedOnce(a.grad(), at::matmul(x32.t(), dxa));
  // x's gradient is the sum of two rounded products, rounded: within a unit of each term and one
  // of the sum.
  const at::Tensor t1 = at::matmul(dy32, w32), t2 = at::matmul(dxa, a32.t());
  const at::Tensor bound = (t1.abs() + t2.abs() + (t1 + t2).abs()).clamp_min(1e-3) * (1.0 / 128);
  EXPECT_TRUE((x.grad().to(at::kFloat) - (t1 + t2)).abs().le(bound).all().item<bool>());
}

TEST(MatmulTest, Float32ProductsArePyTorchsOwn) {
  const at::Tensor a = at::randn({21, 40}), b = at::randn({40, 11}), bias = at::randn({11});
  EXPECT_TRUE(at::equal(Matmul(a, b), at::matmul(a, b)));
  EXPECT_TRUE(at::equal(Linear(a, b.t(), bias), at::linear(a, b.t(), bias)));
  at::Tensor y = at::randn({21, 11}), expected = y.clone();
  AddMatmul_(y, a, b);
  expected.addmm_(a, b);
  EXPECT_TRUE(at::equal(y, expected));
}

}  // namespace
}  // namespace oomb::kernels
