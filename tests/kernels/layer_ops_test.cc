// Gemma's RMSNorm and GELU-tanh gate, the gated activation with the LoRA down projection, and a
// mixture of experts' pair permutations, scaled activation and whole MLP, as autograd functions that keep
// less for backward (kernels/torch/layer_ops.h, kernels/torch/expert_ops.h) against the
// composite ATen ops they replace: the same forward values bit for bit, and the same gradients
// (float64: 1e-12 relative; float32 and bfloat16 inputs: as close as the composite ops are to
// float64).
#include "kernels/torch/layer_ops.h"

#include "kernels/torch/expert_ops.h"
#include "kernels/torch/matmul.h"

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

namespace oomb::kernels {
namespace {

// The bytes of CPU tensors allocated while installed and not yet freed (LibTorch's
// memory-reporting hook, as the chunk trainer counts activations).
class LiveBytes : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void*, int64_t alloc_size, size_t, size_t, c10::Device) override { bytes_ += alloc_size; }
  bool memoryProfilingEnabled() const override { return true; }
  int64_t bytes() const { return bytes_; }

 private:
  int64_t bytes_ = 0;
};

int64_t Bytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

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

// What f's graph keeps, run on leaves cloned from `inputs`: the bytes allocated in forward and
// alive after it, less the output.
int64_t KeptBytes(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f,
                  const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> leaves;
  for (const at::Tensor& t : inputs) leaves.push_back(t.detach().clone().requires_grad_(true));
  auto live = std::make_shared<LiveBytes>();
  at::Tensor out;
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, live);
    out = f(leaves);
  }
  return live->bytes() - Bytes(out);
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

// The gated activation and the LoRA down projection as one function against the separate ops
// (SwiGlu / GeluTanhGlu, then the frozen linear and its adapter as Linear::Partial
// computes them): the same output bit for bit; gradients for gate, up, A and B as close as the
// separate ops' (float64: 1e-12; float32 1e-5; bfloat16: within twice the separate ops' own
// distance from float64); and it keeps less for backward: an [rows, intermediate] tensor less.
TEST(LayerOpsTest, GluDownLoraEqualsTheSeparateOpsAndKeepsLess) {
  at::manual_seed(5);
  const int64_t rows = 9, inter = 80, out = 24, rank = 4;
  const at::Tensor gate = at::randn({rows, inter}, at::kDouble) * 2, up = at::randn({rows, inter}, at::kDouble);
  const at::Tensor w = at::randn({out, inter}, at::kDouble) * 0.1, a = at::randn({rank, inter}, at::kDouble) * 0.1;
  const at::Tensor b = at::randn({out, rank}, at::kDouble) * 0.1, dy = at::randn({rows, out}, at::kDouble);
  for (const GluKind kind : {GluKind::kSilu, GluKind::kGeluTanh}) {
    const auto separate = [&](const at::Tensor& weight) {
      return [&, weight](const std::vector<at::Tensor>& in) {
        const at::Tensor act = kind == GluKind::kSilu ? SwiGlu(in[0], in[1]) : GeluTanhGlu(in[0], in[1]);
        at::Tensor y = at::linear(act, weight);
        return y.addmm_(at::linear(act, in[2]), in[3].t());
      };
    };
    const auto fused = [&](const at::Tensor& weight) {
      return [&, weight](const std::vector<at::Tensor>& in) {
        return GluDownLora(kind, in[0], in[1], weight, in[2], in[3]);
      };
    };
    const Result exact = OutputAndGrads(separate(w), {gate, up, a, b}, dy);
    for (const at::ScalarType t : {at::kDouble, at::kFloat, at::kBFloat16}) {
      const std::vector<at::Tensor> in = {gate.to(t), up.to(t), a.to(t), b.to(t)};
      const Result want = OutputAndGrads(separate(w.to(t)), in, dy);
      const Result got = OutputAndGrads(fused(w.to(t)), in, dy);
      EXPECT_TRUE(at::equal(got.out, want.out)) << t << " kind " << static_cast<int>(kind);
      for (size_t i = 0; i < 4; ++i) {
        const double tolerance = t == at::kDouble  ? 1e-12
                                 : t == at::kFloat ? 1e-5
                                                   : std::max(2 * RelativeError(want.grads[i], exact.grads[i]), 1e-2);
        EXPECT_LE(RelativeError(got.grads[i], exact.grads[i]), tolerance)
            << t << " kind " << static_cast<int>(kind) << " input " << i;
      }
    }
  }
  // What the graph keeps (float32, the composite SwiGLU): the separate ops hold gate, up,
  // silu(gate) and act; the function gate, up and the rank-wide act A^T. Counted: the bytes
  // allocated in forward and still alive after it, less the output.
  const auto kept = [&](const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f) {
    std::vector<at::Tensor> in;
    for (const at::Tensor& t : {gate, up, a, b}) in.push_back(t.to(at::kFloat).requires_grad_(true));
    auto live = std::make_shared<LiveBytes>();
    at::Tensor y;
    {
      c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, live);
      y = f(in);
    }
    return live->bytes() - Bytes(y);
  };
  const at::Tensor w32 = w.to(at::kFloat);
  const int64_t act = rows * inter * 4;
  for (const GluKind kind : {GluKind::kSilu, GluKind::kGeluTanh}) {
    const int64_t separate = kept([&](const std::vector<at::Tensor>& in) {
      const at::Tensor x = kind == GluKind::kSilu ? SwiGlu(in[0], in[1]) : GeluTanhGlu(in[0], in[1]);
      at::Tensor y = at::linear(x, w32);
      return y.addmm_(at::linear(x, in[2]), in[3].t());
    });
    const int64_t fused =
        kept([&](const std::vector<at::Tensor>& in) { return GluDownLora(kind, in[0], in[1], w32, in[2], in[3]); });
    EXPECT_EQ(fused, rows * rank * 4) << static_cast<int>(kind);  // act A^T (gate and up are inputs)
    EXPECT_GE(separate - fused, act) << static_cast<int>(kind);
  }
}

// A mixture of experts' permutations of the (token, slot) pairs against index_select and a sum
// over each token's slots: the same values bit for bit (float64, bfloat16) and the same
// gradients (index_add_ there, gathers here: float64 1e-15; bfloat16 within the separate ops'
// own distance from float64, where index_add_ rounds after each addition).
TEST(LayerOpsTest, PairPermutationsEqualIndexSelectAndSum) {
  at::manual_seed(6);
  const int64_t tokens = 11, top_k = 3, hidden = 40, experts = 5;
  const at::Tensor order = at::argsort(at::randint(experts, {tokens * top_k}, at::kLong), /*stable=*/true);
  const at::Tensor inverse = at::empty_like(order).scatter_(0, order, at::arange(tokens * top_k, at::kLong));
  const at::Tensor x = at::randn({tokens, hidden}, at::kDouble),
                   rows = at::randn({tokens * top_k, hidden}, at::kDouble);
  const at::Tensor d_rows = at::randn({tokens * top_k, hidden}, at::kDouble),
                   d_x = at::randn({tokens, hidden}, at::kDouble);
  const auto separate_to = [&](const auto& in) { return in[0].index_select(0, at::div(order, top_k, "floor")); };
  const auto separate_from = [&](const auto& in) {
    return in[0].index_select(0, inverse).view({tokens, top_k, hidden}).sum(1);
  };
  const Result exact_to = OutputAndGrads(separate_to, {x}, d_rows);
  const Result exact_from = OutputAndGrads(separate_from, {rows}, d_x);
  for (const at::ScalarType t : {at::kDouble, at::kBFloat16}) {
    const Result want_to = OutputAndGrads(separate_to, {x.to(t)}, d_rows);
    const Result got_to =
        OutputAndGrads([&](const auto& in) { return ToPairs(in[0], order, inverse, top_k); }, {x.to(t)}, d_rows);
    EXPECT_TRUE(at::equal(got_to.out, want_to.out)) << t;
    EXPECT_LE(RelativeError(got_to.grads[0], exact_to.grads[0]),
              t == at::kDouble ? 1e-15 : std::max(RelativeError(want_to.grads[0], exact_to.grads[0]), 1e-2))
        << t;
    const Result want_from = OutputAndGrads(separate_from, {rows.to(t)}, d_x);
    const Result got_from =
        OutputAndGrads([&](const auto& in) { return FromPairs(in[0], order, inverse, top_k); }, {rows.to(t)}, d_x);
    EXPECT_TRUE(at::equal(got_from.out, want_from.out)) << t;
    EXPECT_TRUE(at::equal(got_from.grads[0], want_from.grads[0])) << t;  // a gather both ways
  }
  EXPECT_TRUE(at::equal(
      OutputAndGrads([&](const auto& in) { return FromPairs(in[0], order, inverse, top_k); }, {rows}, d_x).grads[0],
      exact_from.grads[0]));
  // A second source (the experts' LoRA update) in the same sum: rows + extra's values (bfloat16:
  // rounded once, from float32 sums), and the gradient of each is rows' alone.
  const at::Tensor extra = at::randn({tokens * top_k, hidden}, at::kDouble);
  const Result exact_both = OutputAndGrads(separate_from, {rows + extra}, d_x);
  for (const at::ScalarType t : {at::kDouble, at::kBFloat16}) {
    const Result got = OutputAndGrads([&](const auto& in) { return FromPairs(in[0], order, inverse, top_k, in[1]); },
                                      {rows.to(t), extra.to(t)}, d_x);
    const at::Tensor want =
        separate_from(std::vector<at::Tensor>{rows.to(t).to(at::kDouble) + extra.to(t).to(at::kDouble)}).to(t);
    EXPECT_TRUE(at::equal(got.out, want)) << t;
    EXPECT_TRUE(at::equal(got.grads[0], exact_both.grads[0].to(t)) && at::equal(got.grads[1], got.grads[0])) << t;
  }
  EXPECT_THROW(ToPairs(x, order.narrow(0, 0, 5), inverse, top_k), c10::Error);
  EXPECT_THROW(FromPairs(x, order, inverse, top_k), c10::Error);
  EXPECT_THROW(FromPairs(rows, order, inverse, top_k, extra.narrow(1, 0, 5)), c10::Error);
}

// The experts' scaled activation against the separate ops (SwiGlu over gate_up's halves, or
// ClampedSwiGlu, times each row's scale): the same values bit for bit, gradients for gate_up
// and the scale as close as the separate ops' (float64 1e-12, float32 1e-5, bfloat16 within twice
// the separate ops' own distance from float64), and keeping gate_up and the scale alone where the
// separate ops also keep the activation.
TEST(LayerOpsTest, ScaledExpertActivationEqualsTheSeparateOpsAndKeepsLess) {
  at::manual_seed(7);
  const int64_t rows = 13, n = 48;
  const at::Tensor gate_up = at::randn({rows, 2 * n}, at::kDouble) * 2, scale = at::rand({rows}, at::kDouble);
  const at::Tensor dy = at::randn({rows, n}, at::kDouble);
  for (const double limit : {0.0, 1.5}) {
    const double alpha = 1.702;
    const auto separate = [&](const std::vector<at::Tensor>& in) {
      const auto parts = in[0].chunk(2, -1);
      const at::Tensor act = limit > 0 ? ClampedSwiGlu(in[0], alpha, limit) : SwiGlu(parts[0], parts[1]);
      return (act * in[1].unsqueeze(-1)).to(in[0].scalar_type());
    };
    const auto fused = [&](const std::vector<at::Tensor>& in) {
      return ScaledExpertActivation(in[0], in[1], alpha, limit);
    };
    const Result exact = OutputAndGrads(separate, {gate_up, scale}, dy);
    for (const at::ScalarType t : {at::kDouble, at::kFloat, at::kBFloat16}) {
      // Mixtral's routing weights stay float32 beside bfloat16 activations.
      const at::ScalarType s = t == at::kBFloat16 && limit == 0 ? at::kFloat : t;
      const std::vector<at::Tensor> in = {gate_up.to(t), scale.to(s)};
      const Result want = OutputAndGrads(separate, in, dy);
      const Result got = OutputAndGrads(fused, in, dy);
      EXPECT_TRUE(at::equal(got.out, want.out)) << t << " limit " << limit;
      for (size_t i = 0; i < 2; ++i) {
        const double tolerance = t == at::kDouble  ? 1e-12
                                 : t == at::kFloat ? 1e-5
                                                   : std::max(2 * RelativeError(want.grads[i], exact.grads[i]), 1e-2);
        EXPECT_LE(RelativeError(got.grads[i], exact.grads[i]), tolerance) << t << " limit " << limit << " input " << i;
      }
    }
  }
  // What the graph keeps (float32, bytes allocated in forward and alive after it, less the
  // output): the separate ops at least the activation, the function nothing (gate_up and the
  // scale are inputs).
  const auto kept = [&](const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f) {
    const std::vector<at::Tensor> in = {gate_up.to(at::kFloat).requires_grad_(true),
                                        scale.to(at::kFloat).requires_grad_(true)};
    auto live = std::make_shared<LiveBytes>();
    at::Tensor y;
    {
      c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, live);
      y = f(in);
    }
    return live->bytes() - Bytes(y);
  };
  const int64_t separate = kept([](const std::vector<at::Tensor>& in) {
    const auto parts = in[0].chunk(2, -1);
    return SwiGlu(parts[0], parts[1]) * in[1].unsqueeze(-1);
  });
  EXPECT_EQ(kept([](const std::vector<at::Tensor>& in) { return ScaledExpertActivation(in[0], in[1], 0, 0); }), 0);
  EXPECT_GE(separate, rows * n * 4);
}

// A mixture of experts' MLP in one function (GroupedExpertMlp) against the separate functions it
// replaces (ToPairs, GroupedMatmul, ScaledExpertActivation, FromPairs), float32 on the CPU's
// grouped loop, with LoRA on both banks, on either and on none, SwiGLU and the clamped one, an
// expert with no pairs: the same values bit for bit, gradients of the tokens, the routing
// weights and the LoRA factors within 1e-5, and of the pairs keeping only the activation's input
// and the rank-wide LoRA intermediates, where the separate functions also keep each pair's input
// row and activation; recomputing the gate_up product, the intermediates alone.
TEST(LayerOpsTest, GroupedExpertMlpEqualsTheSeparateFunctionsAndKeepsLess) {
  at::manual_seed(8);
  const int64_t tokens = 10, top_k = 2, hidden = 32, n = 16, rank = 4, experts = 4, pairs = tokens * top_k;
  // Expert 2 gets no pair.
  const at::Tensor routed = at::tensor({0, 1, 3}, at::kLong).index_select(0, at::randint(3, {pairs}, at::kLong));
  const at::Tensor order = at::argsort(routed, /*stable=*/true);
  const at::Tensor inverse = at::empty_like(order).scatter_(0, order, at::arange(pairs, at::kLong));
  const at::Tensor offs = at::bincount(routed, {}, experts).cumsum(0).to(at::kInt);
  const at::Tensor y = at::randn({tokens, hidden}), scale = at::rand({pairs}), dy = at::randn({tokens, hidden});
  // Each expert's matrix column-major, as GroupedBankOperands holds it.
  const auto bank = [&](int64_t in, int64_t out, double s) {
    return (at::randn({experts, out, in}) * s).transpose(1, 2);
  };
  const at::Tensor gate_up_w = bank(hidden, 2 * n, 0.3), down_w = bank(n, hidden, 0.3);
  const at::Tensor gate_up_a = bank(hidden, rank, 0.3), gate_up_b = bank(rank, 2 * n, 0.3);
  const at::Tensor down_a = bank(n, rank, 0.3), down_b = bank(rank, hidden, 0.3);
  for (const double limit : {0.0, 1.5}) {
    for (const bool gate_up_lora : {true, false}) {
      for (const bool down_lora : {true, false}) {
        SCOPED_TRACE(testing::Message() << "limit " << limit << " gate_up LoRA " << gate_up_lora << " down LoRA "
                                        << down_lora);
        // in: y, scale, gate_up's a and b, down's a and b.
        const auto separate = [&](const std::vector<at::Tensor>& in) {
          const at::Tensor x = ToPairs(in[0], order, inverse, top_k);
          const at::Tensor add =
              gate_up_lora ? GroupedMatmul(GroupedMatmul(x, in[2], offs), in[3], offs) : at::Tensor();
          const at::Tensor act = ScaledExpertActivation(GroupedMatmul(x, gate_up_w, offs), in[1], 1.702, limit, add);
          const at::Tensor extra =
              down_lora ? GroupedMatmul(GroupedMatmul(act, in[4], offs), in[5], offs) : at::Tensor();
          return FromPairs(GroupedMatmul(act, down_w, offs), order, inverse, top_k, extra);
        };
        const auto fused_with = [&](bool recompute, const std::vector<at::Tensor>& in) {
          const GroupedBankOperands g{
              .weight = gate_up_w, .a = gate_up_lora ? in[2] : at::Tensor(), .b = gate_up_lora ? in[3] : at::Tensor()};
          const GroupedBankOperands d{
              .weight = down_w, .a = down_lora ? in[4] : at::Tensor(), .b = down_lora ? in[5] : at::Tensor()};
          return GroupedExpertMlp(in[0], order, inverse, top_k, offs, in[1], g, d, 1.702, limit, recompute);
        };
        const auto fused = [&](const std::vector<at::Tensor>& in) { return fused_with(false, in); };
        const auto recomputing = [&](const std::vector<at::Tensor>& in) { return fused_with(true, in); };
        const std::vector<at::Tensor> in = {y, scale, gate_up_a, gate_up_b, down_a, down_b};
        const Result want = OutputAndGrads(separate, in, dy);
        for (const bool recompute : {false, true}) {
          const Result got = OutputAndGrads([&](const auto& v) { return fused_with(recompute, v); }, in, dy);
          EXPECT_TRUE(at::equal(got.out, want.out)) << "recompute " << recompute;
          for (size_t i = 0; i < in.size(); ++i) {
            const bool used = i < 2 || (i < 4 ? gate_up_lora : down_lora);
            ASSERT_EQ(got.grads[i].defined(), used) << "input " << i;
            if (used) {
              EXPECT_LE(RelativeError(got.grads[i], want.grads[i]), 1e-5)
                  << "input " << i << " recompute " << recompute;
            }
          }
        }
        const auto kept = [&](const auto& f) { return KeptBytes(f, in); };
        const int64_t intermediates = ((gate_up_lora ? 1 : 0) + (down_lora ? 1 : 0)) * pairs * rank * 4;
        const int64_t fused_kept = kept(fused);
        EXPECT_LE(fused_kept, pairs * 2 * n * 4 + intermediates + 1024);  // + the empty placeholders
        EXPECT_LE(kept(recomputing), intermediates + 1024);
        EXPECT_GE(fused_kept - kept(recomputing), pairs * 2 * n * 4);
        if (gate_up_lora && down_lora) {
          EXPECT_GE(kept(separate) - fused_kept, pairs * (hidden + n) * 4);
        }
      }
    }
  }
  const GroupedBankOperands frozen_gate_up{.weight = gate_up_w, .a = at::Tensor(), .b = at::Tensor()},
      frozen_down{.weight = down_w, .a = at::Tensor(), .b = at::Tensor()},
      half{.weight = gate_up_w, .a = gate_up_a, .b = at::Tensor()};
  EXPECT_THROW(
      GroupedExpertMlp(y, order, inverse, top_k, offs, scale.narrow(0, 0, 5), frozen_gate_up, frozen_down, 0, 0),
      c10::Error);
  EXPECT_THROW(GroupedExpertMlp(y, order, inverse, top_k, offs, scale, half, frozen_down, 0, 0), c10::Error);
}

}  // namespace
}  // namespace oomb::kernels
