// The LM head's chunked cross-entropy (kernels/torch/chunked_cross_entropy.h) against
// at::cross_entropy over the whole logits matrix, in float64: the loss, and the gradients of
// hidden and of a weight that requires one (tied embeddings, full fine-tuning) for an incoming
// gradient that is not a power of two, with ignored rows and a block holding no label; no
// gradient work without grad mode; the per-row scores; labels outside the vocabulary refused.
#include "kernels/torch/chunked_cross_entropy.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <stdexcept>

#include "kernels/torch/layer_ops.h"

namespace oomb::kernels {
namespace {

constexpr int64_t kRows = 37, kDim = 8, kVocab = 50, kBlock = 8;

struct Inputs {
  at::Tensor hidden, weight, labels;
};

Inputs MakeInputs() {
  at::manual_seed(7);
  Inputs in;
  in.hidden = at::randn({kRows, kDim}, at::kDouble);
  in.weight = at::randn({kVocab, kDim}, at::kDouble);
  in.labels = at::randint(kVocab, {kRows}, at::kLong);
  in.labels.slice(0, 8, 16).fill_(kIgnoreIndex);  // the second block has no label
  in.labels[3] = kIgnoreIndex;
  in.labels[30] = kIgnoreIndex;
  return in;
}

TEST(ChunkedCrossEntropyTest, LossAndGradientsEqualTheWholeLogitsCrossEntropy) {
  const Inputs in = MakeInputs();
  const double g = 0.37;
  const at::Tensor h = in.hidden.clone().requires_grad_(true), w = in.weight.clone().requires_grad_(true);
  const at::Tensor loss = ChunkedLmHeadCrossEntropy(h, w, in.labels, kBlock);
  torch::autograd::backward({loss * g});
  const at::Tensor rh = in.hidden.clone().requires_grad_(true), rw = in.weight.clone().requires_grad_(true);
  const at::Tensor ref =
      at::cross_entropy_loss(at::matmul(rh, rw.t()), in.labels, {}, at::Reduction::Sum, kIgnoreIndex);
  torch::autograd::backward({ref * g});
  EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-10 * ref.item<double>());
  EXPECT_TRUE(at::allclose(h.grad(), rh.grad(), 1e-10, 1e-12));
  EXPECT_TRUE(at::allclose(w.grad(), rw.grad(), 1e-10, 1e-12));
  EXPECT_EQ(h.grad().slice(0, 8, 16).abs().max().item<double>(), 0.0);  // the unlabelled block
  EXPECT_EQ(h.grad()[3].abs().max().item<double>(), 0.0);
}

TEST(ChunkedCrossEntropyTest, AFrozenWeightGetsNoGradientAndNoGradModeNoGraph) {
  const Inputs in = MakeInputs();
  const at::Tensor h = in.hidden.clone().requires_grad_(true);
  const at::Tensor loss = ChunkedLmHeadCrossEntropy(h, in.weight, in.labels, kBlock);
  torch::autograd::backward({loss});
  EXPECT_TRUE(h.grad().defined());
  EXPECT_FALSE(in.weight.grad().defined());
  at::NoGradGuard no_grad;
  const at::Tensor eval = ChunkedLmHeadCrossEntropy(h, in.weight, in.labels, kBlock);
  EXPECT_FALSE(eval.requires_grad());
  EXPECT_NEAR(eval.item<double>(), loss.item<double>(), 1e-12);
}

TEST(ChunkedCrossEntropyTest, TokenScoresSumToTheLossAndMarkTheArgmax) {
  const Inputs in = MakeInputs();
  const auto [loss, hit] = LmHeadTokenScores(in.hidden, in.weight, in.labels, kBlock);
  EXPECT_NEAR(loss.sum().item<double>(),
              ChunkedLmHeadCrossEntropy(in.hidden, in.weight, in.labels, kBlock).item<double>(), 1e-10);
  const at::Tensor valid = in.labels.ne(kIgnoreIndex);
  const at::Tensor argmax_hit = at::matmul(in.hidden, in.weight.t()).argmax(-1).eq(in.labels) & valid;
  EXPECT_TRUE(at::equal(hit, argmax_hit));
  EXPECT_EQ(loss.masked_select(valid.logical_not()).abs().max().item<double>(), 0.0);
}

TEST(ChunkedCrossEntropyTest, ALabelOutsideTheVocabularyIsRefusedNamingTheRow) {
  Inputs in = MakeInputs();
  in.labels[20] = kVocab;
  try {
    ChunkedLmHeadCrossEntropy(in.hidden, in.weight, in.labels, kBlock);
    FAIL() << "accepted a label outside the vocabulary";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("row 20 holds 50"), std::string::npos) << e.what();
  }
  in.labels[20] = -1;
  EXPECT_THROW(LmHeadTokenScores(in.hidden, in.weight, in.labels, kBlock), std::exception);
}

// The rows' composite (the CPU path) in float32 against float64: loss and gradient in place.
TEST(ChunkedCrossEntropyTest, CrossEntropyRowsGivesTheLossAndSoftmaxMinusOneHot) {
  const Inputs in = MakeInputs();
  at::Tensor x = at::matmul(in.hidden, in.weight.t());
  const at::Tensor probs = at::softmax(x, -1);
  at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor loss = CrossEntropyRows(x32, in.labels, /*write_grad=*/true);
  const at::Tensor want = at::cross_entropy_loss(x, in.labels, {}, at::Reduction::None, kIgnoreIndex);
  EXPECT_TRUE(at::allclose(loss.to(at::kDouble), want, 1e-5, 1e-5));
  at::Tensor grad = probs.clone();
  const at::Tensor valid = in.labels.ne(kIgnoreIndex);
  for (int64_t r = 0; r < kRows; ++r) {
    if (valid[r].item<bool>()) {
      grad[r][in.labels[r].item<int64_t>()] -= 1;
    } else {
      grad[r].zero_();
    }
  }
  EXPECT_TRUE(at::allclose(x32.to(at::kDouble), grad, 1e-5, 1e-6));
}

}  // namespace
}  // namespace oomb::kernels
