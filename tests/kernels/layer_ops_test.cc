// Gemma's RMSNorm and GELU-tanh gate as autograd functions that keep less for backward
// (kernels/torch/layer_ops.h) against the composite ATen ops they replace: the same forward
// values bit for bit, and the same gradients (float64: 1e-12 relative; float32 and bfloat16
// inputs: as close as the composite ops are to float64).
#include "kernels/torch/layer_ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <vector>

namespace oomb::kernels {
namespace {

struct Result {
  at::Tensor out;
  std::vector<at::Tensor> grads;
};

// f's output and the gradients of sum(out * dy) with respect to `inputs`.
Result OutputAndGrads(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f,
                      const std::vector<at::Tensor>& inputs, const at::Tensor& dy) {
  std::vector<at::Tensor> in;
  for (const at::Tensor& t : inputs) in.push_back(t.detach().clone().requires_grad_(true));
  Result r;
  r.out = f(in);
  r.out.backward(dy.to(r.out.scalar_type()));
  for (const at::Tensor& t : in) r.grads.push_back(t.grad());
  return r;
}

double RelativeError(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor w = want.to(at::kDouble);
  return (got.to(at::kDouble) - w).abs().max().item<double>() / std::max(w.abs().max().item<double>(), 1e-30);
}

TEST(LayerOpsTest, GemmaRmsNormEqualsTheCompositeOps) {
  at::manual_seed(3);
  const at::Tensor x64 = at::randn({6, 5, 64}, at::kDouble) * 3;
  const at::Tensor w64 = at::randn({64}, at::kDouble) * 0.5;  // frozen (no gradient)
  const at::Tensor dy64 = at::randn({6, 5, 64}, at::kDouble);
  const double eps = 1e-6;
  const auto lean = [&](const at::Tensor& w) {
    return [&, w](const std::vector<at::Tensor>& in) { return GemmaRmsNorm(in[0], w, eps); };
  };
  const auto composite = [&](const at::Tensor& w) {
    return [&, w](const std::vector<at::Tensor>& in) { return GemmaRmsNormComposite(in[0], w, eps); };
  };
  const Result want = OutputAndGrads(composite(w64), {x64}, dy64);
  const Result got = OutputAndGrads(lean(w64), {x64}, dy64);
  EXPECT_TRUE(at::equal(got.out, want.out));
  EXPECT_LE(RelativeError(got.grads[0], want.grads[0]), 1e-12);
  for (const at::ScalarType t : {at::kFloat, at::kBFloat16}) {
    const at::Tensor x = x64.to(t), w = w64.to(t);
    const Result c = OutputAndGrads(composite(w), {x}, dy64);
    const Result l = OutputAndGrads(lean(w), {x}, dy64);
    EXPECT_TRUE(at::equal(l.out, c.out)) << t;
    // The composite ops' own distance from float64, times two, bounds the lean one's.
    const Result exact = OutputAndGrads(composite(w.to(at::kDouble)), {x.to(at::kDouble)}, dy64);
    const double tolerance = std::max(2 * RelativeError(c.grads[0], exact.grads[0]), 1e-6);
    EXPECT_LE(RelativeError(l.grads[0], exact.grads[0]), tolerance) << t;
  }
  // A weight that requires a gradient (full fine-tuning) gets it, through the composite path.
  const at::Tensor w = w64.clone().requires_grad_(true);
  GemmaRmsNorm(x64, w, eps).mul(dy64).sum().backward();
  const at::Tensor w2 = w64.clone().requires_grad_(true);
  GemmaRmsNormComposite(x64, w2, eps).mul(dy64).sum().backward();
  EXPECT_TRUE(at::allclose(w.grad(), w2.grad()));
}

TEST(LayerOpsTest, GeluTanhGluEqualsTheCompositeOps) {
  at::manual_seed(4);
  const at::Tensor gate = at::randn({7, 96}, at::kDouble) * 2, up = at::randn({7, 96}, at::kDouble);
  const at::Tensor dy = at::randn({7, 96}, at::kDouble);
  for (const at::ScalarType t : {at::kDouble, at::kFloat, at::kBFloat16}) {
    const Result want =
        OutputAndGrads([](const auto& in) { return GeluTanhGluComposite(in[0], in[1]); }, {gate.to(t), up.to(t)}, dy);
    const Result got =
        OutputAndGrads([](const auto& in) { return GeluTanhGlu(in[0], in[1]); }, {gate.to(t), up.to(t)}, dy);
    EXPECT_TRUE(at::equal(got.out, want.out)) << t;
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_LE(RelativeError(got.grads[i], want.grads[i]), t == at::kDouble  ? 1e-14
                                                            : t == at::kFloat ? 1e-6
                                                                              : 1e-2)
          << t << " input " << i;
    }
  }
}

}  // namespace
}  // namespace oomb::kernels
