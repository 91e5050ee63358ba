// The attention over KV pages on the CPU, against dense attention in float64: forward, dq, the
// chunk's dk/dv and the past's dK/dV accumulated through PastKv.
#include <gtest/gtest.h>

#include "tests/kernels/paged_attention_check.h"

namespace oomb {
namespace {

TEST(PagedAttentionTest, MatchesDenseAttentionInFloat64) {
  // Past of 37 tokens read in key blocks of 8 (the last block partial); chunk of 19; GQA 6/2.
  const auto e = testing::CheckPagedAttention(at::kCPU, at::kDouble, 37, 19, 6, 2, 8, {0}, 8, 1);
  EXPECT_LE(e.max(), 1e-12) << "out " << e.out << " dq " << e.dq << " dk " << e.dk << " dv " << e.dv << " dk_past "
                            << e.dk_past << " dv_past " << e.dv_past;
}

TEST(PagedAttentionTest, RespectsPackedDocuments) {
  // Documents start at 0, 20 (in the past), 41 (inside the chunk) and 50.
  const auto e = testing::CheckPagedAttention(at::kCPU, at::kDouble, 37, 19, 4, 4, 8, {20, 41, 50}, 16, 2);
  EXPECT_LE(e.max(), 1e-12);
}

TEST(PagedAttentionTest, NoPast) {
  const auto e = testing::CheckPagedAttention(at::kCPU, at::kDouble, 0, 33, 4, 1, 16, {0, 9}, 16, 3);
  EXPECT_LE(e.max(), 1e-12);
}

// A sliding-window layer: windows shorter than the chunk (13) and longer (30), one reaching back
// past a document's start (20, in the past), over key blocks of 8.
TEST(PagedAttentionTest, SlidingWindows) {
  for (const int64_t window : {13, 30}) {
    const auto e = testing::CheckPagedAttention(at::kCPU, at::kDouble, 37, 19, 6, 2, 8, {20}, 8, 5,
                                                kernels::GpuAttentionKernel::kCudnn, window);
    EXPECT_LE(e.max(), 1e-12) << "window " << window << ": out " << e.out << " dq " << e.dq << " dk_past " << e.dk_past;
  }
}

// Attention sinks (gpt-oss): one more logit per query head, with a zero value, folded into the
// log-sum-exp; the output, every gradient and the sinks' own against the dense reference's
// softmax over the scores and the sink column, with and without a past, packed documents, GQA
// and windows (shorter than the chunk, not a multiple of the key block).
TEST(PagedAttentionTest, AttentionSinks) {
  struct Case {
    int64_t S, C, window;
    std::vector<int64_t> docs;
  };
  for (const Case& c : {Case{37, 19, 0, {0}}, Case{0, 33, 0, {0, 9}}, Case{37, 19, 13, {20}}, Case{37, 19, 30, {0}},
                        Case{37, 19, 0, {20, 41, 50}}}) {
    const auto e = testing::CheckPagedAttention(at::kCPU, at::kDouble, c.S, c.C, 6, 2, 8, c.docs, 8, 12,
                                                kernels::GpuAttentionKernel::kCudnn, c.window, /*sinks=*/true);
    EXPECT_LE(e.max(), 1e-12) << "S " << c.S << " window " << c.window << ": out " << e.out << " dq " << e.dq
                              << " dk_past " << e.dk_past << " dsinks " << e.dsinks;
  }
}

// float32 against float64: within twice the error of the same dense computation done in
// float32 (docs/CONVENTIONS.md §6.10), and never worse than 1e-5.
TEST(PagedAttentionTest, Float32Precision) {
  const auto e = testing::CheckPagedAttention(at::kCPU, at::kFloat, 300, 100, 8, 2, 32, {0, 150}, 64, 4);
  EXPECT_LE(e.max(), 1e-5) << "out " << e.out << " dq " << e.dq << " dk_past " << e.dk_past;
}

}  // namespace
}  // namespace oomb
