// GPU checks of kernels/ against their CPU references on random inputs (never zeros): the page
// copy and addition kernels (bit-exact), and the attention over KV pages on CUDA in float32 and bfloat16
// against dense float64 attention; the fused layer ops (RMSNorm, RoPE, SwiGLU and its scaled
// form, cross-entropy rows, the experts' pair sums, the attention blocks' merge) against their
// composite ATen forms; the GPU timeline's sections. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <torch/cuda.h>

#include "kernels/page_copy.h"
#include "kernels/torch/expert_ops.h"
#include "kernels/torch/fused_attention.h"
#include "kernels/torch/gpu_timeline.h"
#include "kernels/torch/layer_ops.h"
#include "kernels/torch/page_ops.h"
#include "tests/kernels/paged_attention_check.h"
#include "tests/kernels/sparse_attention_check.h"

namespace oomb {
namespace {

class KernelsGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(KernelsGpuTest, PageCopiesMatchCpuReference) {
  at::manual_seed(5);
  for (const auto dtype : {at::kBFloat16, at::kFloat}) {
    const at::Tensor arena = at::randn({300, 2, 4, 128, 128}).to(dtype);
    const at::Tensor slots = at::randperm(300, at::kInt).slice(0, 0, 97);
    at::Tensor garena = arena.cuda();
    const at::Tensor gslots = slots.cuda();
    auto [gk, gv] = kernels::GatherPages(garena, gslots);
    auto [ck, cv] = kernels::GatherPages(arena, slots);
    EXPECT_TRUE(at::equal(gk.cpu(), ck) && at::equal(gv.cpu(), cv));
    // Scatter back permuted data and compare arenas.
    at::Tensor carena = arena.clone();
    const at::Tensor nk = at::randn(ck.sizes()).to(dtype), nv = at::randn(cv.sizes()).to(dtype);
    kernels::ScatterPages(garena, gslots, nk.cuda(), nv.cuda());
    kernels::ScatterPages(carena, slots, nk, nv);
    EXPECT_TRUE(at::equal(garena.cpu(), carena));
  }
  // Accumulation into float32 gradient pages.
  at::Tensor grad = at::randn({64, 2, 2, 128, 64});
  at::Tensor ggrad = grad.cuda();
  const at::Tensor slots = at::randperm(64, at::kInt).slice(0, 0, 20);
  const at::Tensor dk = at::randn({2, 20 * 128, 64}), dv = at::randn({2, 20 * 128, 64});
  kernels::ScatterAddPages(grad, slots, dk, dv);
  kernels::ScatterAddPages(ggrad, slots.cuda(), dk.cuda(), dv.cuda());
  EXPECT_LE((ggrad.cpu() - grad).abs().max().item<float>(), 1e-6);
}

// The copy kernel of the copy engine's fetches (kernels/page_copy.h LaunchCopyRuns): runs of
// every size around its 32 KiB descriptors (one 16-byte vector, one descriptor, one and a bit,
// many), from pinned host memory to scattered device offsets, land byte for byte; with 3 blocks
// and an odd number of descriptors, so blocks take pairs and a lone last one.
TEST_F(KernelsGpuTest, CopyRunsMoveEveryByteOfEveryRun) {
  at::manual_seed(6);
  const int64_t host_bytes = int64_t{4} << 20;
  const at::Tensor host = at::randint(0, 256, {host_bytes}, at::kByte).pin_memory();
  const std::vector<int64_t> sizes = {16,         4096, kernels::kCopySegmentBytes,     kernels::kCopySegmentBytes + 16,
                                      300 * 1024, 48,   2 * kernels::kCopySegmentBytes, 1 << 20,
                                      32};
  at::Tensor device = at::zeros({host_bytes}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
  at::Tensor want = at::zeros({host_bytes}, at::kByte);
  std::vector<kernels::CopyRunDesc> runs;
  int64_t src = 0, dst = host_bytes;
  for (const int64_t bytes : sizes) {  // sources ascending, destinations descending
    dst -= bytes + 1024;
    runs.push_back(
        {static_cast<const char*>(host.data_ptr()) + src, static_cast<char*>(device.data_ptr()) + dst, bytes});
    want.slice(0, dst, dst + bytes).copy_(host.slice(0, src, src + bytes));
    src += bytes + 512;
  }
  const std::vector<kernels::CopyRunDesc> segments = kernels::CopySegments(runs);
  int64_t total = 0;
  for (const kernels::CopyRunDesc& s : segments) {
    ASSERT_LE(s.bytes, kernels::kCopySegmentBytes);
    total += s.bytes;
  }
  ASSERT_EQ(segments.size() % 2, 1u);
  const auto n = static_cast<int64_t>(segments.size() * sizeof(kernels::CopyRunDesc));
  const at::Tensor descs = at::from_blob(const_cast<kernels::CopyRunDesc*>(segments.data()), {n}, at::kByte).cuda();
  ASSERT_EQ(kernels::LaunchCopyRuns(static_cast<const kernels::CopyRunDesc*>(descs.data_ptr()),
                                    static_cast<int64_t>(segments.size()), 3, nullptr),
            cudaSuccess);
  EXPECT_TRUE(at::equal(device.cpu(), want)) << segments.size() << " descriptors, " << total << " bytes";
}

// The addition kernel of the copy engine's additions into host pages (kernels/page_copy.h
// LaunchAddRuns): runs of every size around its 32 KiB descriptors, from device contributions
// into pinned host memory, read, added and written back there; bit for bit what the CPU adds
// (bfloat16: in float32, rounded once), every element outside the runs untouched. 3 blocks, an
// odd number of descriptors.
TEST_F(KernelsGpuTest, AddRunsAddIntoHostMemoryAsTheCpuAdds) {
  at::manual_seed(7);
  const std::vector<std::pair<at::ScalarType, kernels::AddType>> types = {{at::kBFloat16, kernels::AddType::kBFloat16},
                                                                          {at::kFloat, kernels::AddType::kFloat32},
                                                                          {at::kDouble, kernels::AddType::kFloat64}};
  for (const auto& [dtype, type] : types) {
    SCOPED_TRACE(c10::toString(dtype));
    const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype)), n = (int64_t{4} << 20) / elem;
    const at::Tensor host = at::randn({n}).to(dtype).pin_memory();
    const at::Tensor src = at::randn({n}).to(dtype);
    const at::Tensor device_src = src.cuda();
    at::Tensor want = host.clone();
    const std::vector<int64_t> sizes = {
        16, 4096, kernels::kCopySegmentBytes, kernels::kCopySegmentBytes + 16, 300 * 1024, 48, 1 << 20, 32};
    std::vector<kernels::CopyRunDesc> runs;
    int64_t at_src = 0, at_dst = n * elem;
    for (const int64_t bytes : sizes) {  // sources ascending, destinations descending
      at_dst -= bytes + 1024;
      runs.push_back({static_cast<const char*>(device_src.data_ptr()) + at_src,
                      static_cast<char*>(host.data_ptr()) + at_dst, bytes});
      const at::Tensor w = want.slice(0, at_dst / elem, (at_dst + bytes) / elem);
      w.copy_(at::add(w, src.slice(0, at_src / elem, (at_src + bytes) / elem)));
      at_src += bytes + 512;
    }
    const std::vector<kernels::CopyRunDesc> segments = kernels::CopySegments(runs);
    ASSERT_EQ(segments.size() % 2, 1u);
    const auto bytes = static_cast<int64_t>(segments.size() * sizeof(kernels::CopyRunDesc));
    const at::Tensor descs =
        at::from_blob(const_cast<kernels::CopyRunDesc*>(segments.data()), {bytes}, at::kByte).cuda();
    ASSERT_EQ(kernels::LaunchAddRuns(static_cast<const kernels::CopyRunDesc*>(descs.data_ptr()),
                                     static_cast<int64_t>(segments.size()), type, 3, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(at::equal(host, want));
  }
}

// Sparse attention's page copies (kernels/selected_pages.h) against the CPU reference: the
// gather bit-exact, the accumulation within float32 summation order (bfloat16 pages: one
// rounding). The selection repeats pages across tiles (a sink page in every tile) and has -1
// entries, which the gather fills with zeros and the accumulation skips.
TEST_F(KernelsGpuTest, SelectedPagesMatchCpuReference) {
  at::manual_seed(6);
  const int64_t n_tiles = 5, kv_heads = 4, n = 7, pages = 97, P = 128, D = 128;
  at::Tensor selection = at::randint(1, pages, {n_tiles, kv_heads, n}, at::kLong);
  selection.select(2, 0).fill_(0);        // every tile selects page 0
  selection[3].slice(1, 0, 2).fill_(-1);  // fewer pages visible to tile 3
  const at::Tensor slots = at::randperm(300, at::kInt).slice(0, 0, pages);
  for (const auto arena_dtype : {at::kBFloat16, at::kFloat}) {
    const at::Tensor arena = at::randn({300, 2, kv_heads, P, D}).to(arena_dtype);
    auto [k, v] = kernels::GatherSelectedPages(arena, slots, selection);
    auto [gk, gv] = kernels::GatherSelectedPages(arena.cuda(), slots.cuda(), selection.cuda());
    EXPECT_TRUE(at::equal(gk.cpu(), k)) << arena_dtype;
    EXPECT_TRUE(at::equal(gv.cpu(), v)) << arena_dtype;
    EXPECT_EQ(k[3][0].slice(0, 0, 2 * P).abs().sum().item<double>(), 0.0);  // the -1 entries
    // The odd pages' selecting heads moved to packed images (fetched host pages beside the
    // arena). The reference on the CPU, then the kernel.
    std::vector<bool> odd(pages);
    for (int64_t page = 0; page < pages; ++page) odd[page] = page % 2 == 1;
    const testing::TwoSources two = testing::MoveToSecond(arena, slots, selection, odd);
    auto [ck, cv] = kernels::GatherSelectedPages(arena, two.slots, selection, two.second);
    EXPECT_TRUE(at::equal(ck, k) && at::equal(cv, v)) << arena_dtype << ", two sources, CPU";
    auto [g2k, g2v] = kernels::GatherSelectedPages(arena.cuda(), two.slots.cuda(), selection.cuda(), two.second.cuda());
    EXPECT_TRUE(at::equal(g2k.cpu(), k) && at::equal(g2v.cpu(), v)) << arena_dtype << ", two sources, CUDA";
    for (const auto grad_dtype : {at::kBFloat16, at::kFloat}) {
      const at::Tensor dk = at::randn(k.sizes()).to(grad_dtype), dv = at::randn(k.sizes()).to(grad_dtype);
      at::Tensor want = arena.clone(), got = arena.cuda();
      kernels::AccumulateSelectedPages(want, slots, selection, dk, dv);
      kernels::AccumulateSelectedPages(got, slots.cuda(), selection.cuda(), dk.cuda(), dv.cuda());
      const double tol = arena_dtype == at::kFloat ? 1e-5 : 2e-2;
      EXPECT_TRUE(at::allclose(got.cpu().to(at::kFloat), want.to(at::kFloat), tol, tol))
          << arena_dtype << " pages, " << grad_dtype << " gradients: max diff "
          << (got.cpu().to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>();
      EXPECT_GT((want.to(at::kFloat) - arena.to(at::kFloat)).abs().sum().item<double>(), 0.0);
      // The odd pages' sums into packed images instead (host gradient pages), on the CPU and
      // with the kernel; every image is set.
      at::Tensor want2 = arena.clone(), got2 = arena.cuda();
      at::Tensor second_want = at::full_like(two.second, std::numeric_limits<float>::quiet_NaN());
      at::Tensor second_got = second_want.cuda();
      kernels::AccumulateSelectedPages(want2, two.slots, selection, dk, dv, second_want);
      kernels::AccumulateSelectedPages(got2, two.slots.cuda(), selection.cuda(), dk.cuda(), dv.cuda(), second_got);
      EXPECT_TRUE(at::allclose(got2.cpu().to(at::kFloat), want2.to(at::kFloat), tol, tol))
          << arena_dtype << " pages, " << grad_dtype << " gradients, two targets: arena";
      EXPECT_TRUE(at::allclose(second_got.cpu().to(at::kFloat), second_want.to(at::kFloat), tol, tol))
          << arena_dtype << " pages, " << grad_dtype << " gradients, two targets: packed images";
      EXPECT_FALSE(second_want.isnan().any().item<bool>());
    }
  }
}

TEST_F(KernelsGpuTest, PagedAttentionFloat32) {
  const auto e = testing::CheckPagedAttention(at::kCUDA, at::kFloat, 4096, 1024, 28, 4, 128, {0, 3000}, 1024, 6);
  // TF32 is off by default for LibTorch matmuls: float32 arithmetic, errors far below 1e-4.
  EXPECT_LE(e.max(), 1e-4) << "out " << e.out << " dq " << e.dq << " dk_past " << e.dk_past;
}

// The fused path with each kernel: four past blocks of 1024 merged by log-sum-exp, then the
// chunk; and a chunk whose document starts inside the past (blocks from token 1000 on, the
// keys before it masked by leaving them out).
TEST_F(KernelsGpuTest, PagedAttentionBfloat16) {
  for (const auto kernel : {kernels::GpuAttentionKernel::kCudnn, kernels::GpuAttentionKernel::kFlash}) {
    for (const std::vector<int64_t>& docs : {std::vector<int64_t>{0}, std::vector<int64_t>{0, 1000}}) {
      const auto e =
          testing::CheckPagedAttention(at::kCUDA, at::kBFloat16, 4096, 1024, 28, 4, 128, docs, 1024, 7, kernel);
      // bf16 operands: the output and gradients land between 1e-3 and 1e-2 of float64.
      EXPECT_LE(e.max(), 2e-2) << (kernel == kernels::GpuAttentionKernel::kCudnn ? "cudnn" : "flash") << " docs "
                               << docs.size() << ": out " << e.out << " dq " << e.dq << " dk " << e.dk << " dk_past "
                               << e.dk_past;
      std::cout << (kernel == kernels::GpuAttentionKernel::kCudnn ? "cudnn" : "flash") << " docs " << docs.size()
                << ": max relative error " << e.max() << "\n";
    }
  }
}

// Sliding-window layers (Gemma 3, gpt-oss, Mistral) on the fused path: the flash kernel's local
// windows, whichever kernel is asked for. Windows shorter than the chunk (the past block's
// later queries see none of it and are left out of it), longer, not a multiple of anything,
// reaching back past a document's start, without a past; head dims 128 and 256 (Gemma 3's).
TEST_F(KernelsGpuTest, PagedAttentionSlidingWindowsBfloat16) {
  struct Case {
    int64_t S, C, D, window;
    std::vector<int64_t> docs;
  };
  for (const Case& c :
       {Case{4096, 1024, 128, 512, {0}}, Case{4096, 1024, 128, 1500, {0}}, Case{4096, 1024, 256, 3000, {0, 2000}},
        Case{0, 1024, 256, 300, {0}}, Case{2048, 1000, 256, 1024, {0}}}) {
    const auto e = testing::CheckPagedAttention(at::kCUDA, at::kBFloat16, c.S, c.C, 16, 8, c.D, c.docs, 1024, 8,
                                                kernels::GpuAttentionKernel::kCudnn, c.window);
    EXPECT_LE(e.max(), 2e-2) << "S " << c.S << " C " << c.C << " window " << c.window << ": out " << e.out << " dq "
                             << e.dq << " dk " << e.dk << " dk_past " << e.dk_past;
    std::cout << "window " << c.window << " S " << c.S << " D " << c.D << ": max relative error " << e.max() << "\n";
  }
}

// Head dim 256 (Gemma 3's global layers) with either kernel.
TEST_F(KernelsGpuTest, PagedAttentionHeadDim256Bfloat16) {
  for (const auto kernel : {kernels::GpuAttentionKernel::kCudnn, kernels::GpuAttentionKernel::kFlash}) {
    const auto e =
        testing::CheckPagedAttention(at::kCUDA, at::kBFloat16, 4096, 1024, 16, 8, 256, {0, 1000}, 1024, 9, kernel);
    EXPECT_LE(e.max(), 2e-2) << (kernel == kernels::GpuAttentionKernel::kCudnn ? "cudnn" : "flash") << ": out " << e.out
                             << " dq " << e.dq << " dk " << e.dk << " dk_past " << e.dk_past;
  }
}

// Sparse attention on CUDA against float64 attention masked to the same selection (made on the
// GPU from the bf16 / float32 keys): Qwen2.5-7B's head layout, 32 past pages of 128, 8 selected.
kernels::PageSelectOptions SevenBSelection() {
  kernels::PageSelectOptions o;
  o.page_tokens = 128;
  o.page_budget = 8;
  o.sink_pages = 1;
  o.local_pages = 2;
  return o;
}

TEST_F(KernelsGpuTest, SparseAttentionBfloat16Fused) {
  // One document from token 0: the fused path, with either kernel; a chunk of whole tiles, one
  // whose last tile is short (padded in the fused path), and one without a past.
  for (const auto kernel : {kernels::GpuAttentionKernel::kCudnn, kernels::GpuAttentionKernel::kFlash}) {
    for (const auto& [S, C] : std::vector<std::pair<int64_t, int64_t>>{{4096, 512}, {4096, 440}, {0, 300}}) {
      const auto e = testing::CheckSparseAttention(at::kCUDA, at::kBFloat16, S, C, 28, 4, 128, {0}, SevenBSelection(),
                                                   9, nullptr, kernel);
      EXPECT_LE(e.max(), 2e-2) << (kernel == kernels::GpuAttentionKernel::kCudnn ? "cudnn" : "flash") << " S " << S
                               << " C " << C << ": out " << e.out << " dq " << e.dq << " dk " << e.dk << " dk_past "
                               << e.dk_past << " dv_past " << e.dv_past;
    }
  }
}

// A budget covering all 32 past pages: every tile and head selects every page, and the fused
// sparse path lands as close to float64 dense attention as the dense paged path does on the
// same inputs (the same seed draws the same q, k, v and output gradient).
TEST_F(KernelsGpuTest, SparseAttentionFullBudgetIsDenseBfloat16) {
  auto o = SevenBSelection();
  o.page_budget = 32;
  at::Tensor selection;
  const auto sparse =
      testing::CheckSparseAttention(at::kCUDA, at::kBFloat16, 4096, 512, 28, 4, 128, {0}, o, 11, &selection);
  EXPECT_EQ(selection.ge(0).sum().item<int64_t>(), selection.numel());
  const auto dense = testing::CheckPagedAttention(at::kCUDA, at::kBFloat16, 4096, 512, 28, 4, 128, {0}, 1024, 11);
  std::cout << "relative to float64 dense: sparse " << sparse.max() << ", dense paged " << dense.max() << "\n";
  EXPECT_LE(sparse.max(), 2e-2);
  EXPECT_LE(sparse.max(), 1.5 * dense.max());
}

TEST_F(KernelsGpuTest, SparseAttentionFloat32PackedReferencePath) {
  auto o = SevenBSelection();
  o.summary = kernels::PageSummary::kMinMax;
  const auto e = testing::CheckSparseAttention(at::kCUDA, at::kFloat, 4096, 512, 28, 4, 128, {0, 1000}, o, 10);
  EXPECT_LE(e.max(), 1e-4) << "out " << e.out << " dq " << e.dq << " dk_past " << e.dk_past;
}

// Attention sinks (gpt-oss: 64 heads over 8, head dim 64, windows of 128) in the fused paths:
// dense over the whole past with either kernel, a window (the flash kernel's), and sparse, with
// the sinks' gradients, against float64 with a sink column.
TEST_F(KernelsGpuTest, AttentionSinksBfloat16) {
  for (const auto kernel : {kernels::GpuAttentionKernel::kCudnn, kernels::GpuAttentionKernel::kFlash}) {
    for (const int64_t window : {0, 128}) {
      const auto e = testing::CheckPagedAttention(at::kCUDA, at::kBFloat16, 4096, 1024, 64, 8, 64, {0}, 1024, 13,
                                                  kernel, window, /*sinks=*/true);
      EXPECT_LE(e.max(), 2e-2) << "window " << window << ": out " << e.out << " dq " << e.dq << " dk_past " << e.dk_past
                               << " dsinks " << e.dsinks;
    }
  }
  const auto s = testing::CheckSparseAttention(at::kCUDA, at::kBFloat16, 4096, 512, 64, 8, 64, {0}, SevenBSelection(),
                                               14, nullptr, kernels::GpuAttentionKernel::kCudnn, /*sinks=*/true);
  EXPECT_LE(s.max(), 2e-2) << "sparse: out " << s.out << " dq " << s.dq << " dsinks " << s.dsinks;
}

// ---- Fused layer ops (kernels/torch/layer_ops.h) against the composite ops ----------------

// The output and the input gradients of `op` on leaves made from `inputs` for upstream `dy`.
template <typename Op>
std::vector<at::Tensor> OutputAndGrads(Op op, const std::vector<at::Tensor>& inputs, const at::Tensor& dy) {
  std::vector<at::Tensor> leaves;
  for (const at::Tensor& t : inputs) leaves.push_back(t.detach().clone().requires_grad_(true));
  const at::Tensor y = op(leaves);
  y.backward(dy);
  std::vector<at::Tensor> r = {y.detach()};
  for (const at::Tensor& l : leaves) r.push_back(l.grad());
  return r;
}

// RoPE and SwiGLU (also over the halves of one gate_up tensor, SwiGluHalves): the kernels equal
// the composite ops bit for bit, forward and backward, in bfloat16 and float16, at sizes that are
// no multiple of the block, 8 elements a thread (16-byte loads) and one (sizes not divisible by 8).
TEST_F(KernelsGpuTest, RopeAndSwiGluEqualTheCompositeOpsBitForBit) {
  for (const at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dt));
    const auto o = at::device(at::kCUDA).dtype(dt);
    for (const int64_t D : {12, 64, 128}) {
      const int64_t rows = 257, heads = 3;
      const at::Tensor x = at::randn({rows, heads, D}, o) * 3;
      const at::Tensor angle = at::rand({rows, 1, D}, o.dtype(at::kFloat)) * 100;
      const at::Tensor cos = angle.cos().to(dt), sin = angle.sin().to(dt);
      const at::Tensor dy = at::randn({rows, heads, D}, o);
      const auto fused = OutputAndGrads([&](const auto& in) { return kernels::ApplyRope(in[0], cos, sin); }, {x}, dy);
      const auto ref =
          OutputAndGrads([&](const auto& in) { return kernels::ApplyRopeComposite(in[0], cos, sin); }, {x}, dy);
      for (size_t i = 0; i < ref.size(); ++i) EXPECT_TRUE(at::equal(fused[i], ref[i])) << "rope D " << D << " " << i;
    }
    for (const int64_t cols : {77, 1024}) {
      const at::Tensor gate = at::randn({513, cols}, o) * 4, up = at::randn({513, cols}, o);
      const at::Tensor dy = at::randn({513, cols}, o);
      const auto fused = OutputAndGrads([](const auto& in) { return kernels::SwiGlu(in[0], in[1]); }, {gate, up}, dy);
      const auto ref =
          OutputAndGrads([](const auto& in) { return kernels::SwiGluComposite(in[0], in[1]); }, {gate, up}, dy);
      for (size_t i = 0; i < ref.size(); ++i) EXPECT_TRUE(at::equal(fused[i], ref[i])) << "swiglu " << cols << " " << i;
      // Over the halves of one gate_up tensor, read in place (rows 2 cols apart).
      const at::Tensor gate_up = at::cat({gate, up}, 1);
      const auto halves = OutputAndGrads([](const auto& in) { return kernels::SwiGluHalves(in[0]); }, {gate_up}, dy);
      EXPECT_TRUE(at::equal(halves[0], ref[0])) << "halves " << cols;
      EXPECT_TRUE(at::equal(halves[1], at::cat({ref[1], ref[2]}, 1))) << "halves' gradient " << cols;
    }
  }
}

// The merge of two attention blocks by log-sum-exp (MergeFusedBlock on the AttentionMerge kernel)
// equals the composite float32 ops bit for bit: a running output in float32 or the blocks' dtype,
// merged into float32 or that dtype, bfloat16 and float16, head_dim 128 (8 elements a thread) and
// 12 (one); two blocks' merge and a third's.
TEST_F(KernelsGpuTest, AttentionMergesEqualTheCompositeOpsBitForBit) {
  const int64_t B = 2, C = 301, H = 5;
  const auto cuda = at::device(at::kCUDA);
  for (const at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dt));
    for (const int64_t D : {128, 12}) {
      std::vector<at::Tensor> outs, lses;
      for (int b = 0; b < 3; ++b) {
        outs.push_back(at::randn({B, C, H, D}, cuda.dtype(dt)));
        lses.push_back(at::randn({B, H, C}, cuda.dtype(at::kFloat)) * 4);
      }
      const auto composite = [](const at::Tensor& a, const at::Tensor& la, const at::Tensor& b, const at::Tensor& lb,
                                at::ScalarType result) {
        const at::Tensor m = at::logaddexp(la, lb);
        const at::Tensor w = at::exp(la - m).transpose(1, 2).unsqueeze(-1);
        const at::Tensor w_b = at::exp(lb - m).transpose(1, 2).unsqueeze(-1);
        return std::make_pair((a.to(at::kFloat) * w + b.to(at::kFloat) * w_b).to(result), m);
      };
      for (const at::ScalarType first : {dt, at::kFloat}) {
        for (const at::ScalarType result : {at::kFloat, dt}) {
          at::Tensor out, lse;
          kernels::MergeFusedBlock(&out, &lse, outs[0], lses[0], first);
          kernels::MergeFusedBlock(&out, &lse, outs[1], lses[1], result);
          const auto [want, m] = composite(outs[0].to(first), lses[0], outs[1], lses[1], result);
          EXPECT_EQ(out.scalar_type(), result);
          EXPECT_TRUE(at::equal(out, want) && at::equal(lse, m)) << D << " " << first << " " << result;
          if (result != at::kFloat) continue;
          kernels::MergeFusedBlock(&out, &lse, outs[2], lses[2], dt);
          const auto [want3, m3] = composite(want, m, outs[2], lses[2], dt);
          EXPECT_TRUE(at::equal(out, want3) && at::equal(lse, m3)) << "third block " << D << " " << first;
        }
      }
    }
  }
}

// The experts' activation scaled by their routing weights (ScaledExpertActivation with SwiGLU) on
// the scaled gated-activation kernels: the output and gate_up's gradient equal the composite ops'
// (SwiGluHalves' halves times the scale) bit for bit, the scale's gradient their row sums within a
// rounding of the dtype; with a LoRA update added in the same pass, as the composite's addition;
// bfloat16 and float16, 8 elements a thread (768 columns, a warp's several passes over a row) and
// one (77).
TEST_F(KernelsGpuTest, ScaledSwiGluEqualsTheCompositeOps) {
  for (const at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dt));
    const auto o = at::device(at::kCUDA).dtype(dt);
    const double eps = dt == at::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;
    for (const int64_t cols : {77, 768}) {
      const int64_t rows = 1031;
      const at::Tensor gate_up = at::randn({rows, 2 * cols}, o) * 3, scale = at::rand({rows}, o) + 0.01;
      const at::Tensor dy = at::randn({rows, cols}, o);
      const auto fused = OutputAndGrads(
          [](const auto& in) { return kernels::ScaledExpertActivation(in[0], in[1], 1.0, 0.0); }, {gate_up, scale}, dy);
      const auto ref = OutputAndGrads(
          [](const auto& in) {
            const auto halves = in[0].chunk(2, -1);
            return kernels::SwiGluComposite(halves[0], halves[1]) * in[1].unsqueeze(-1);
          },
          {gate_up, scale}, dy);
      EXPECT_TRUE(at::equal(fused[0], ref[0])) << "value " << cols;
      EXPECT_TRUE(at::equal(fused[1], ref[1])) << "gate_up's gradient " << cols;
      EXPECT_TRUE(at::allclose(fused[2].to(at::kDouble), ref[2].to(at::kDouble), eps, 1e-3)) << "scale's " << cols;
      // With a LoRA update added in the same pass: as the composite's addition first.
      const at::Tensor add = at::randn({rows, 2 * cols}, o);
      const auto fused_add =
          OutputAndGrads([](const auto& in) { return kernels::ScaledExpertActivation(in[0], in[1], 1.0, 0.0, in[2]); },
                         {gate_up, scale, add}, dy);
      const auto ref_add = OutputAndGrads(
          [](const auto& in) {
            const auto halves = (in[0] + in[2]).chunk(2, -1);
            return kernels::SwiGluComposite(halves[0], halves[1]) * in[1].unsqueeze(-1);
          },
          {gate_up, scale, add}, dy);
      EXPECT_TRUE(at::equal(fused_add[0], ref_add[0])) << "value with the update " << cols;
      EXPECT_TRUE(at::equal(fused_add[1], ref_add[1]) && at::equal(fused_add[3], ref_add[3]))
          << "gate_up's and the update's gradients " << cols;
      EXPECT_TRUE(at::allclose(fused_add[2].to(at::kDouble), ref_add[2].to(at::kDouble), eps, 1e-3)) << cols;
      const at::NoGradGuard no_grad;  // nothing kept, the same value
      EXPECT_TRUE(at::equal(kernels::ScaledExpertActivation(gate_up, scale, 1.0, 0.0, add), ref_add[0])) << cols;
    }
  }
}

// The experts' sum over each token's pairs (kernels::PairSum, and FromPairs through it) on the
// pair-sum kernel: as close to the float64 sum as one rounding to the dtype, with and without the
// LoRA update as a second source, 8 elements a thread (2048 columns) and one (77); FromPairs'
// gradient, for both sources, the output gradient gathered to the pairs bit for bit.
TEST_F(KernelsGpuTest, PairSumsEqualTheFloat64SumsRounded) {
  const int64_t tokens = 301, top_k = 8, experts = 16;
  const auto cuda = at::device(at::kCUDA);
  const at::Tensor order = at::argsort(at::randint(experts, {tokens * top_k}, cuda.dtype(at::kLong)), /*stable=*/true);
  const at::Tensor inverse = at::empty_like(order).scatter_(0, order, at::arange(tokens * top_k, order.options()));
  for (const at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dt));
    const double eps = dt == at::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;
    for (const int64_t cols : {77, 2048}) {
      const at::Tensor rows = at::randn({tokens * top_k, cols}, cuda.dtype(dt)),
                       extra = at::randn({tokens * top_k, cols}, cuda.dtype(dt)) * 0.1;
      for (const bool with_extra : {false, true}) {
        const at::Tensor e = with_extra ? extra : at::Tensor();
        const at::Tensor got = kernels::PairSum(rows, e, inverse, top_k);
        const at::Tensor want =
            kernels::PairSumComposite(rows.to(at::kDouble), with_extra ? extra.to(at::kDouble) : e, inverse, top_k);
        EXPECT_TRUE(at::allclose(got.to(at::kDouble), want, eps, 1e-3)) << cols << " " << with_extra;
      }
      const at::Tensor dy = at::randn({tokens, cols}, cuda.dtype(dt));
      const auto fused = OutputAndGrads(
          [&](const auto& in) { return kernels::FromPairs(in[0], order, inverse, top_k, in[1]); }, {rows, extra}, dy);
      const at::Tensor pairs_dy = dy.index_select(0, at::div(order, top_k, "floor"));
      EXPECT_TRUE(at::equal(fused[1], pairs_dy) && at::equal(fused[2], pairs_dy)) << cols;
      EXPECT_TRUE(at::equal(fused[0], kernels::PairSum(rows, extra, inverse, top_k))) << cols;
    }
  }
}

// Gemma's gated activation, gelu_tanh(gate) * up, on the gated-activation kernel: output and
// gradients as close to float64 as the composite ops' (within a rounding step of the dtype), in
// bfloat16 and float16, 8 elements a thread and one (77 columns); how many values differ from the
// composite's at all is printed.
TEST_F(KernelsGpuTest, GeluTanhGluMatchesFloat64AsCloselyAsTheCompositeOps) {
  for (const at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dt));
    const auto o = at::device(at::kCUDA).dtype(dt);
    for (const int64_t cols : {77, 1024}) {
      const at::Tensor gate = at::randn({513, cols}, o) * 3, up = at::randn({513, cols}, o);
      const at::Tensor dy = at::randn({513, cols}, o);
      const auto fused =
          OutputAndGrads([](const auto& in) { return kernels::GeluTanhGlu(in[0], in[1]); }, {gate, up}, dy);
      const auto comp =
          OutputAndGrads([](const auto& in) { return kernels::GeluTanhGluComposite(in[0], in[1]); }, {gate, up}, dy);
      const auto exact = OutputAndGrads([](const auto& in) { return kernels::GeluTanhGluComposite(in[0], in[1]); },
                                        {gate.to(at::kDouble), up.to(at::kDouble)}, dy.to(at::kDouble));
      const double step = dt == at::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;  // a rounding step at 1
      for (size_t i = 0; i < exact.size(); ++i) {
        const double scale = exact[i].abs().max().item<double>();
        const double e_fused = (fused[i].to(at::kDouble) - exact[i]).abs().max().item<double>() / scale;
        const double e_comp = (comp[i].to(at::kDouble) - exact[i]).abs().max().item<double>() / scale;
        EXPECT_LE(e_fused, e_comp + step) << "cols " << cols << " output/gradient " << i;
        EXPECT_LE(e_fused, 2 * step) << "cols " << cols << " output/gradient " << i;
        std::cout << c10::toString(dt) << " cols " << cols << " output/gradient " << i << ": "
                  << fused[i].ne(comp[i]).sum().item<int64_t>() << " of " << fused[i].numel()
                  << " values differ from the composite's\n";
      }
    }
  }
}

// The gated activation with the LoRA down projection (kernels::GluDownLora) on the GPU, where
// SwiGLU runs its kernels, against the separate ops in bfloat16: the same output bit for bit,
// and gradients for gate, up, A and B within 1% of the separate ops' (the products' rounding
// and cuBLAS's order of summation may differ).
TEST_F(KernelsGpuTest, GluDownLoraEqualsTheSeparateOps) {
  const auto o = at::device(at::kCUDA).dtype(at::kBFloat16);
  const int64_t rows = 515, inter = 1000, out = 384, rank = 16;
  const at::Tensor gate = at::randn({rows, inter}, o) * 2, up = at::randn({rows, inter}, o);
  const at::Tensor w = at::randn({out, inter}, o) * 0.05, a = at::randn({rank, inter}, o) * 0.05;
  const at::Tensor b = at::randn({out, rank}, o) * 0.05, dy = at::randn({rows, out}, o);
  for (const kernels::GluKind kind : {kernels::GluKind::kSilu, kernels::GluKind::kGeluTanh}) {
    const auto fused =
        OutputAndGrads([&](const auto& in) { return kernels::GluDownLora(kind, in[0], in[1], w, in[2], in[3]); },
                       {gate, up, a, b}, dy);
    const auto ref = OutputAndGrads(
        [&](const auto& in) {
          const at::Tensor act =
              kind == kernels::GluKind::kSilu ? kernels::SwiGlu(in[0], in[1]) : kernels::GeluTanhGlu(in[0], in[1]);
          at::Tensor y = at::linear(act, w);
          return y.addmm_(at::linear(act, in[2]), in[3].t());
        },
        {gate, up, a, b}, dy);
    EXPECT_TRUE(at::equal(fused[0], ref[0])) << "kind " << static_cast<int>(kind);
    for (size_t i = 1; i < ref.size(); ++i) {
      const at::Tensor want = ref[i].to(at::kFloat);
      const double error =
          (fused[i].to(at::kFloat) - want).abs().max().item<double>() / want.abs().max().item<double>();
      EXPECT_LE(error, 1e-2) << "kind " << static_cast<int>(kind) << " gradient " << i;
    }
  }
}

// RMSNorm, and Gemma's (1 + w) variant: the kernel sums in another order than ATen, so it is
// checked against float64: its output and input gradient are as close to it as the
// composite's (within a rounding step of the dtype), in bfloat16 and float16, 8 elements a
// thread and one (999 columns), a warp a row (up to 1024 columns; 301 rows leave the last block
// of 8 rows part empty) and a block a row (3584), and over the 256 features of each head of
// [rows, heads, 256] (q/k norms). A weight that needs a gradient takes the composite path.
TEST_F(KernelsGpuTest, RmsNormMatchesFloat64AsCloselyAsTheCompositeOps) {
  using Norm = at::Tensor (*)(const at::Tensor&, const at::Tensor&, double);
  const struct {
    const char* name;
    Norm kernel, composite;
  } norms[] = {{"rms", kernels::RmsNorm, kernels::RmsNormComposite},
               {"gemma", kernels::GemmaRmsNorm, kernels::GemmaRmsNormComposite}};
  for (const auto& norm : norms) {
    for (const at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
      SCOPED_TRACE(std::string(norm.name) + " " + c10::toString(dt));
      const auto o = at::device(at::kCUDA).dtype(dt);
      for (const std::vector<int64_t>& shape :
           {std::vector<int64_t>{301, 999}, {301, 1000}, {301, 3584}, {37, 8, 256}}) {
        const int64_t cols = shape.back();
        const at::Tensor x = at::randn(shape, o) * 2, w = at::rand({cols}, o) + 0.5, dy = at::randn(shape, o);
        const double eps = 1e-6;
        const auto fused = OutputAndGrads([&](const auto& in) { return norm.kernel(in[0], w, eps); }, {x}, dy);
        const auto comp = OutputAndGrads([&](const auto& in) { return norm.composite(in[0], w, eps); }, {x}, dy);
        const auto exact = OutputAndGrads([&](const auto& in) { return norm.composite(in[0], w.to(at::kDouble), eps); },
                                          {x.to(at::kDouble)}, dy.to(at::kDouble));
        const double step = dt == at::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;  // a rounding step at 1
        for (size_t i = 0; i < 2; ++i) {
          const double scale = exact[i].abs().max().item<double>();
          const double e_fused = (fused[i].to(at::kDouble) - exact[i]).abs().max().item<double>() / scale;
          const double e_comp = (comp[i].to(at::kDouble) - exact[i]).abs().max().item<double>() / scale;
          EXPECT_LE(e_fused, e_comp + step) << "cols " << cols << (i == 0 ? " output" : " dx");
          EXPECT_LE(e_fused, 2 * step) << "cols " << cols << (i == 0 ? " output" : " dx");
        }
      }
    }
  }
  const auto o = at::device(at::kCUDA).dtype(at::kBFloat16);
  const at::Tensor x = at::randn({8, 64}, o), w = (at::rand({64}, o) + 0.5).requires_grad_(true);
  kernels::RmsNorm(x, w, 1e-6).sum().backward();
  EXPECT_TRUE(w.grad().defined());
}

// The cross-entropy rows' kernel (kernels/layer_ops.h) against float64: each row's loss within
// float32 rounding, and the gradient it writes in place within rounding to the dtype of
// float64's, as the composite's, bfloat16 and float16, 8 elements a thread
// (a vocabulary of 32768) and one (1001), ignored rows at 0. Without write_grad the logits stay.
TEST_F(KernelsGpuTest, CrossEntropyRowsMatchFloat64AsCloselyAsTheCompositeOps) {
  for (const at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dt));
    for (const int64_t vocab : {1001, 32768}) {
      const int64_t rows = 67;
      const at::Tensor logits = (at::randn({rows, vocab}, at::device(at::kCUDA)) * 4).to(dt);
      at::Tensor labels = at::randint(vocab, {rows}, at::device(at::kCUDA).dtype(at::kLong));
      labels.slice(0, 10, 13).fill_(-100);
      at::Tensor fused = logits.clone(), comp = logits.clone(), exact = logits.to(at::kDouble);
      const at::Tensor loss_fused = kernels::CrossEntropyRows(fused, labels, true);
      const at::Tensor loss_comp = kernels::CrossEntropyRowsComposite(comp, labels, true);
      const at::Tensor loss_exact = kernels::CrossEntropyRowsComposite(exact, labels, true);
      EXPECT_EQ(loss_fused.scalar_type(), at::kFloat);
      EXPECT_LE((loss_fused.to(at::kDouble) - loss_exact).abs().max().item<double>(), 1e-5 * 20) << vocab;
      EXPECT_EQ(loss_fused.slice(0, 10, 13).abs().max().item<float>(), 0.f);
      const double step = dt == at::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;
      const double e_fused = (fused.to(at::kDouble) - exact).abs().max().item<double>();
      const double e_comp = (comp.to(at::kDouble) - exact).abs().max().item<double>();
      EXPECT_LE(e_comp, step / 2) << vocab;  // every value is below 1 in magnitude: half a step or less
      EXPECT_LE(e_fused, step / 2) << vocab;
      EXPECT_EQ(fused.slice(0, 10, 13).abs().max().item<float>(), 0.f) << vocab;
      at::Tensor kept = logits.clone();
      const at::Tensor loss_only = kernels::CrossEntropyRows(kept, labels, false);
      EXPECT_TRUE(at::equal(kept, logits));
      EXPECT_TRUE(at::equal(loss_only, loss_fused));
    }
  }
}

// The timeline gives each section the GPU time up to the next mark: a section holding 20
// large products outweighs one holding a small copy, and the sections add up to the wall
// time around them (the marks sit on the stream that ran the work). A section marked in a
// stage is also reported under "<stage>/<name>", with its own time only. The host's time
// between the marks is split alike: a host sleep lands in its section.
TEST_F(KernelsGpuTest, TimelineSplitsTheStreamBySection) {
  namespace timeline = kernels::timeline;
  const at::Tensor a = at::randn({4096, 4096}, at::device(at::kCUDA).dtype(at::kBFloat16));
  torch::cuda::synchronize();
  timeline::Mark("dropped");  // before Enable: ignored
  timeline::Enable(true);
  const auto start = std::chrono::steady_clock::now();
  timeline::Mark("products");
  for (int i = 0; i < 20; ++i) (void)at::matmul(a, a);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // the host's, while the GPU multiplies
  timeline::Mark("copy");
  (void)a.slice(0, 0, 16).clone();
  timeline::Stage("late");
  timeline::Mark("products");
  (void)at::matmul(a, a);
  std::map<std::string, double> host;
  const std::map<std::string, double> s = timeline::Collect(&host);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  timeline::Stage(nullptr);
  timeline::Enable(false);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_GT(s.at("late/products"), 0);
  EXPECT_LT(s.at("late/products"), 0.5 * s.at("products"));  // one product of 21
  EXPECT_GT(s.at("products"), 10 * s.at("copy"));
  EXPECT_GT(s.at("copy"), 0);
  EXPECT_LE(s.at("products") + s.at("copy"), wall);
  EXPECT_GT(s.at("products") + s.at("copy"), 0.5 * wall);
  // The host: the sleep in "products", the three sections within the wall clock.
  ASSERT_EQ(host.size(), 3u);
  EXPECT_GE(host.at("products"), 0.03);
  EXPECT_LT(host.at("copy"), 0.03);
  EXPECT_LE(host.at("products") + host.at("copy"), wall);
  EXPECT_GT(host.at("late/products"), 0);
  timeline::Mark("off");
  EXPECT_TRUE(timeline::Collect().empty());
}

}  // namespace
}  // namespace oomb
