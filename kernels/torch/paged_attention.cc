#include "kernels/torch/paged_attention.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>

#include "kernels/torch/attention_inputs.h"
#include "kernels/torch/fused_attention.h"
#include "kernels/torch/matmul.h"
#include "kernels/torch/upload.h"

namespace oomb::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Upper bound on score-matrix elements of one (query block, key block) pair: small on the CPU,
// large on a GPU, where fewer and larger launches pay.
constexpr int64_t kCpuBlockScoreElems = int64_t{1} << 22;
constexpr int64_t kGpuBlockScoreElems = int64_t{1} << 27;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct PastHolder : torch::CustomClassHolder {
  PastHolder(std::shared_ptr<PastKv> p, int64_t block) : past(std::move(p)), key_block(block) {}
  std::shared_ptr<PastKv> past;
  int64_t key_block;
};

// The chunk's geometry, and the [Hkv, G, C, D] arrangement of query-side tensors in which the
// G query heads of a KV head are adjacent (head h = kv_head * G + g).
struct Geometry {
  int64_t C, Hq, Hkv, G, D, S, key_block, block_score_elems;
  double scale;
  at::Tensor ToGrouped(const at::Tensor& x) const {  // [C, Hq, D] -> [Hkv, G, C, D]
    return x.reshape({C, Hkv, G, D}).permute({1, 2, 0, 3}).contiguous();
  }
  at::Tensor FromGrouped(const at::Tensor& x) const {  // [Hkv, G, C, D] -> [C, Hq, D]
    return x.permute({2, 0, 1, 3}).reshape({C, Hq, D});
  }
  int64_t QueryBlockRows() const {
    return std::clamp<int64_t>(block_score_elems / std::max<int64_t>(1, Hq * std::max(key_block, C)), 1, C);
  }
};

Geometry Check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& doc_start,
               const PastKv* past, int64_t key_block) {
  CheckChunkAttentionInputs(q, k, v, doc_start);
  TORCH_CHECK(key_block > 0, "key_block_tokens must be > 0, got ", key_block);
  Geometry g;
  g.C = q.size(0);
  g.Hq = q.size(1);
  g.Hkv = k.size(1);
  g.G = g.Hq / g.Hkv;
  g.D = q.size(2);
  g.S = past == nullptr ? 0 : past->past_tokens();
  g.key_block = q.is_cuda() ? std::max<int64_t>(key_block, 16384) : key_block;
  g.block_score_elems = q.is_cuda() ? kGpuBlockScoreElems : kCpuBlockScoreElems;
  g.scale = 1.0 / std::sqrt(static_cast<double>(g.D));
  return g;
}

// Key segments in global token indices: the past in blocks of key_block tokens from the first
// key any query sees (`first_key`, the smallest doc_start: nothing before it is read, so a
// sliding-window layer's store may have released it), then the chunk itself.
struct Segment {
  int64_t begin, end;
  bool past;
};

std::vector<Segment> Segments(const Geometry& g, const at::Tensor& doc_start_cpu) {
  const int64_t* ds = doc_start_cpu.data_ptr<int64_t>();
  const int64_t first_key = g.C > 0 ? *std::min_element(ds, ds + g.C) : 0;
  std::vector<Segment> out;
  for (int64_t b = first_key / g.key_block * g.key_block; b < g.S; b += g.key_block) {
    out.push_back({std::max(b, first_key), std::min(g.S, b + g.key_block), true});
  }
  out.push_back({g.S, g.S + g.C, false});
  return out;
}

// Query rows [i0, i1) and the smallest and largest document start among them.
struct QueryBlock {
  int64_t i0, i1, min_doc, max_doc;
  int64_t rows(const Geometry& g) const { return g.G * (i1 - i0); }
};

std::vector<QueryBlock> QueryBlocks(const Geometry& g, const at::Tensor& doc_start_cpu) {
  std::vector<QueryBlock> out;
  const int64_t* ds = doc_start_cpu.data_ptr<int64_t>();
  for (int64_t i0 = 0; i0 < g.C; i0 += g.QueryBlockRows()) {
    const int64_t i1 = std::min(g.C, i0 + g.QueryBlockRows());
    out.push_back({i0, i1, *std::min_element(ds + i0, ds + i1), *std::max_element(ds + i0, ds + i1)});
  }
  return out;
}

// Whether any query of the block may see any key of the segment.
bool Visible(const Geometry& g, const QueryBlock& b, const Segment& s) {
  return s.end > b.min_doc && s.begin <= g.S + b.i1 - 1;
}

// Masked scores of a query block against a key segment: [Hkv, G * B, K].
at::Tensor Scores(const Geometry& g, const QueryBlock& b, const Segment& s, const at::Tensor& qb,
                  const at::Tensor& keys, const at::Tensor& doc_start) {
  const int64_t B = b.i1 - b.i0, K = s.end - s.begin;
  at::Tensor scores = Matmul(qb, keys.transpose(1, 2)).mul_(g.scale);
  // Every query of the block sees every key of the segment (a past segment inside all their
  // documents): no mask to build or apply.
  if (s.end - 1 <= g.S + b.i0 && s.begin >= b.max_doc) return scores;
  const at::Tensor j = at::arange(s.begin, s.end, doc_start.options());
  const at::Tensor qi = at::arange(g.S + b.i0, g.S + b.i1, doc_start.options());
  const at::Tensor ds = doc_start.slice(0, b.i0, b.i1);
  at::Tensor blocked = (j.unsqueeze(0) < ds.unsqueeze(1)) | (j.unsqueeze(0) > qi.unsqueeze(1));  // [B, K]
  blocked = blocked.unsqueeze(0).expand({g.G, B, K}).reshape({1, g.G * B, K});
  return scores.masked_fill_(blocked, kNegInf);
}

// The segment's keys and values, [Hkv, K, D] in the compute type.
std::pair<at::Tensor, at::Tensor> SegmentKv(const Segment& s, PastKv* past, const at::Tensor& kc, const at::Tensor& vc,
                                            at::ScalarType ct) {
  if (!s.past) return {kc, vc};
  auto [k, v] = past->Read(s.begin, s.end);
  TORCH_CHECK(k.dim() == 3 && k.size(1) == s.end - s.begin && v.sizes() == k.sizes(), "PastKv::Read(", s.begin, ", ",
              s.end, "): got ", k.sizes(), " and ", v.sizes());
  return {k.to(ct), v.to(ct)};
}

// The fused path on a GPU: bf16/fp16 inputs, head_dim a multiple of 8 up to 256 (see the
// header), and one document for the whole chunk, every query seeing it from its start s0
// (all doc_start equal), or a sliding window of W keys over it: doc_start[i] =
// max(s0, S + i - W + 1) (SlidingWindowStart, with the window reaching back past the chunk's
// start for some query). Windows run the flash kernel, the only one that takes them.
struct FusedPlan {
  int64_t s0 = 0;
  int64_t window = 0;  // 0: none
  int64_t first_key(const Geometry& g) const { return window > 0 ? std::max(s0, g.S - window + 1) : s0; }
};

std::optional<FusedPlan> PlanFused(const Geometry& g, const at::Tensor& q, const at::Tensor& doc_start_cpu) {
  if (!q.is_cuda() || (q.scalar_type() != at::kBFloat16 && q.scalar_type() != at::kHalf)) return std::nullopt;
  if (q.size(2) % 8 != 0 || q.size(2) > 256 || g.C == 0) return std::nullopt;
  const int64_t* ds = doc_start_cpu.data_ptr<int64_t>();
  if (std::all_of(ds, ds + g.C, [&](int64_t x) { return x == ds[0]; })) return FusedPlan{ds[0], 0};
  // The last query's start is its window's (it moved, so the window is active there).
  FusedPlan p{ds[0], g.S + g.C - ds[g.C - 1]};
  if (p.window <= 0 || ds[0] > g.S) return std::nullopt;
  for (int64_t i = 0; i < g.C; ++i) {
    if (ds[i] != std::max(p.s0, g.S + i - p.window + 1)) return std::nullopt;  // packed documents: blockwise
  }
  return p;
}

// The fused path's key blocks: the past from the first key any query sees in blocks of
// `key_block` tokens, then the chunk (the only causal block).
std::vector<Segment> FusedBlocks(const Geometry& g, const FusedPlan& plan, int64_t key_block) {
  std::vector<Segment> out;
  for (int64_t b = std::max<int64_t>(plan.first_key(g), 0); b < g.S; b += key_block) {
    out.push_back({b, std::min(g.S, b + key_block), true});
  }
  out.push_back({g.S, g.S + g.C, false});
  return out;
}

// Which queries of a fused block see any of its keys, and through what window: all queries
// and none (no window), or with a window W, for a past block [b0, b1) the first
// r = min(C, b1 - S + W - 1) queries (query i sees key j >= S + i - W + 1) with
// left = b1 - r - S + W - 1 (query i's first key, i + (n - r) - left, is S + i - W + 1 - b0), and
// for the chunk itself every query, causal, left W - 1.
struct BlockQueries {
  int64_t rows;
  LocalWindow window;
};

BlockQueries QueriesOf(const Geometry& g, const FusedPlan& plan, const Segment& s) {
  if (plan.window == 0) return {g.C, {}};
  if (!s.past) return {g.C, {plan.window - 1, -1}};
  const int64_t rows = std::min(g.C, s.end - g.S + plan.window - 1);
  return {rows, {s.end - rows - g.S + plan.window - 1, -1}};
}

// Keys and values of one block, [kv_heads, keys, D] (the chunk's: a view of k, v); prefetches
// the next block's.
std::pair<at::Tensor, at::Tensor> FusedBlockKv(const std::vector<Segment>& blocks, size_t i, PastKv* past,
                                               const at::Tensor& k, const at::Tensor& v, bool backward) {
  if (i + 1 < blocks.size() && blocks[i + 1].past) past->Prefetch(blocks[i + 1].begin, blocks[i + 1].end, backward);
  if (!blocks[i].past) return {k.permute({1, 0, 2}), v.permute({1, 0, 2})};
  auto [pk, pv] = past->Read(blocks[i].begin, blocks[i].end);
  return {pk.to(k.scalar_type()), pv.to(v.scalar_type())};
}

// The kernel a fused plan runs: a window's is flash.
GpuAttentionKernel PlanKernel(const at::Tensor& q, const FusedPlan& plan, GpuAttentionKernel asked) {
  return plan.window > 0 ? GpuAttentionKernel::kFlash : FusedKernel(q, asked);
}

// The fused path's forward: the blocks merged by log-sum-exp, out = sum_b exp(lse_b - lse)
// out_b, lse = logsumexp_b lse_b, each block over the queries that see some of its keys (a
// window's: from out 0, lse -inf, which the first merge replaces).
AttentionResult FusedForward(const Geometry& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const FusedPlan& plan, PastKv* past, int64_t key_block, GpuAttentionKernel fused,
                             const at::Tensor& sinks) {
  const std::vector<Segment> blocks = FusedBlocks(g, plan, key_block);
  const at::Tensor q4 = q.unsqueeze(0);
  AttentionResult r;  // float32 [1, C, Hq, D] (q's dtype after the last block), [1, Hq, C] while merging
  if (plan.window > 0) {
    r.out = at::zeros({1, g.C, g.Hq, g.D}, q.options().dtype(at::kFloat));
    r.lse = at::full({1, g.Hq, g.C}, kNegInf, q.options().dtype(at::kFloat));
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto [keys, values] = FusedBlockKv(blocks, i, past, k, v, /*backward=*/false);
    const BlockQueries seen = QueriesOf(g, plan, blocks[i]);
    FusedBlock b = FusedBlockForward(fused, q4.slice(1, 0, seen.rows), keys.unsqueeze(0), values.unsqueeze(0),
                                     /*causal=*/!blocks[i].past, g.scale, seen.window);
    r.aux = b.aux;
    if (seen.rows == g.C) {
      // The last block without sinks to fold merges straight into q's dtype.
      const bool last = i + 1 == blocks.size() && !sinks.defined();
      MergeFusedBlock(&r.out, &r.lse, b.out, b.lse, last ? q.scalar_type() : at::kFloat);
    } else {
      MergeFusedRows(r.out, r.lse, seen.rows, b.out, b.lse);
    }
  }
  if (sinks.defined())
    r.out.mul_(FoldSinks(r.lse, sinks.to(at::kFloat).view({1, g.Hq, 1})).transpose(1, 2).unsqueeze(-1));
  r.out = r.out.to(q.scalar_type());
  return r;
}

// The blockwise path's forward: query blocks against key segments with an online softmax.
AttentionResult BlockwiseForward(const Geometry& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& doc, const at::Tensor& doc_cpu, PastKv* past,
                                 const at::Tensor& sinks) {
  const at::ScalarType ct = AttentionComputeType(q.scalar_type());
  const at::Tensor qg = g.ToGrouped(q.to(ct));
  const at::Tensor kc = k.to(ct).permute({1, 0, 2}).contiguous(), vc = v.to(ct).permute({1, 0, 2}).contiguous();
  AttentionResult r;
  r.out = at::empty({g.Hkv, g.G, g.C, g.D}, qg.options());
  r.lse = at::empty({g.Hkv, g.G, g.C}, qg.options());
  const std::vector<Segment> segments = Segments(g, doc_cpu);
  for (const QueryBlock& b : QueryBlocks(g, doc_cpu)) {
    const int64_t B = b.i1 - b.i0;
    const at::Tensor qb = qg.slice(2, b.i0, b.i1).reshape({g.Hkv, b.rows(g), g.D});
    at::Tensor m = at::full({g.Hkv, b.rows(g), 1}, kNegInf, qb.options());
    at::Tensor l = at::zeros({g.Hkv, b.rows(g), 1}, qb.options());
    at::Tensor acc = at::zeros({g.Hkv, b.rows(g), g.D}, qb.options());
    for (const Segment& s : segments) {
      if (!Visible(g, b, s)) continue;
      auto [ks, vs] = SegmentKv(s, past, kc, vc, ct);
      const at::Tensor scores = Scores(g, b, s, qb, ks, doc);
      const at::Tensor m_new = at::maximum(m, std::get<0>(scores.max(-1, /*keepdim=*/true)));
      const at::Tensor m_safe = at::where(at::isinf(m_new), at::zeros_like(m_new), m_new);
      const at::Tensor alpha = at::exp(m - m_safe);
      const at::Tensor p = at::exp(scores - m_safe);
      l = l * alpha + p.sum(-1, /*keepdim=*/true);
      acc = acc * alpha + Matmul(p, vs);
      m = m_new;
    }
    r.out.slice(2, b.i0, b.i1).copy_((acc / l).view({g.Hkv, g.G, B, g.D}));
    r.lse.slice(2, b.i0, b.i1).copy_((m + at::log(l)).view({g.Hkv, g.G, B}));
  }
  if (sinks.defined()) r.out.mul_(FoldSinks(r.lse, sinks.to(ct).view({g.Hkv, g.G, 1})).unsqueeze(-1));
  return r;
}

class PagedAttentionFn : public torch::autograd::Function<PagedAttentionFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& doc_start, std::shared_ptr<PastKv> past, int64_t key_block,
                            GpuAttentionKernel kernel, AttentionSwap swap, const at::Tensor& sinks_argument) {
    const at::Tensor sinks = SinksOrNone(sinks_argument);
    const Geometry g = Check(q, k, v, doc_start, past.get(), key_block);
    CheckSinks(sinks, q);
    ctx->saved_data["sinks"] = sinks;
    const at::Tensor doc_cpu = doc_start.cpu().contiguous();  // no wait for a CPU doc_start
    ctx->saved_data["doc_start_cpu"] = doc_cpu;
    const std::optional<FusedPlan> plan = PlanFused(g, q, doc_cpu);
    const at::Tensor doc = plan ? doc_start : Upload(doc_start, q.device());
    AttentionResult r;
    if (swap.replay != nullptr) {
      r = *swap.replay;
    } else {
      r = plan ? FusedForward(g, q, k, v, *plan, past.get(), key_block, PlanKernel(q, *plan, kernel), sinks)
               : BlockwiseForward(g, q, k, v, doc, doc_cpu, past.get(), sinks);
      if (past != nullptr) past->Finished(/*backward=*/false);
    }
    if (swap.keep != nullptr) *swap.keep = r;
    ctx->saved_data["past"] = c10::IValue::make_capsule(c10::make_intrusive<PastHolder>(std::move(past), key_block));
    if (plan) {
      ctx->save_for_backward({q, k, v, doc, r.out, r.lse, r.aux[0], r.aux[1]});
      ctx->saved_data["fused_s0"] = plan->s0;
      ctx->saved_data["fused_window"] = plan->window;
      ctx->saved_data["fused_kernel"] = static_cast<int64_t>(PlanKernel(q, *plan, kernel));
      return r.out.squeeze(0);
    }
    ctx->save_for_backward({q, k, v, doc, r.out, r.lse});
    return g.FromGrouped(r.out).to(q.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &doc_start = saved[3], &out = saved[4],
                     &lse = saved[5];
    auto holder = c10::static_intrusive_pointer_cast<PastHolder>(ctx->saved_data["past"].toCapsule());
    PastKv* past = holder->past.get();
    const Geometry g = Check(q, k, v, doc_start, past, holder->key_block);
    if (ctx->saved_data.count("fused_s0")) return FusedBackward(ctx, g, past, grad_outputs[0]);
    const at::ScalarType ct = AttentionComputeType(q.scalar_type());
    const at::Tensor qg = g.ToGrouped(q.to(ct));
    const at::Tensor kc = k.to(ct).permute({1, 0, 2}).contiguous(), vc = v.to(ct).permute({1, 0, 2}).contiguous();
    const at::Tensor dog = g.ToGrouped(grad_outputs[0].to(ct));
    const at::Tensor di = (dog * out).sum(-1);  // [Hkv, G, C]
    const at::Tensor sinks = ctx->saved_data["sinks"].toTensor();
    at::Tensor dsinks;
    if (sinks.defined()) {
      dsinks =
          SinkGradTerms(lse, sinks.to(ct).view({g.Hkv, g.G, 1}), di).sum(-1).reshape({g.Hq}).to(sinks.scalar_type());
    }
    at::Tensor dqg = at::zeros_like(qg);
    at::Tensor dkc = at::zeros_like(kc), dvc = at::zeros_like(vc);
    const at::ScalarType acc_type = ct == at::kDouble ? at::kDouble : at::kFloat;
    const at::Tensor doc_cpu = ctx->saved_data["doc_start_cpu"].toTensor();
    const std::vector<Segment> segments = Segments(g, doc_cpu);
    for (const QueryBlock& b : QueryBlocks(g, doc_cpu)) {
      const int64_t B = b.i1 - b.i0, R = b.rows(g);
      const at::Tensor qb = qg.slice(2, b.i0, b.i1).reshape({g.Hkv, R, g.D});
      const at::Tensor dob = dog.slice(2, b.i0, b.i1).reshape({g.Hkv, R, g.D});
      const at::Tensor lb = lse.slice(2, b.i0, b.i1).reshape({g.Hkv, R, 1});
      const at::Tensor dib = di.slice(2, b.i0, b.i1).reshape({g.Hkv, R, 1});
      at::Tensor dqb = at::zeros_like(qb);
      for (const Segment& s : segments) {
        if (!Visible(g, b, s)) continue;
        auto [ks, vs] = SegmentKv(s, past, kc, vc, ct);
        const at::Tensor p = at::exp(Scores(g, b, s, qb, ks, doc_start) - lb);
        const at::Tensor ds = p * (Matmul(dob, vs.transpose(1, 2)) - dib);
        dqb.add_(Matmul(ds, ks).mul_(g.scale));
        const at::Tensor dk = Matmul(ds.transpose(1, 2), qb).mul_(g.scale);
        const at::Tensor dv = Matmul(p.transpose(1, 2), dob);
        if (s.past) {
          past->AccumulateGrad(s.begin, dk.to(acc_type), dv.to(acc_type));
        } else {
          dkc.add_(dk);
          dvc.add_(dv);
        }
      }
      dqg.slice(2, b.i0, b.i1).copy_(dqb.view({g.Hkv, g.G, B, g.D}));
    }
    if (past != nullptr) past->Finished(/*backward=*/true);
    at::Tensor dq = g.FromGrouped(dqg).to(q.scalar_type());
    at::Tensor dk = dkc.permute({1, 0, 2}).to(k.scalar_type()).contiguous();
    at::Tensor dv = dvc.permute({1, 0, 2}).to(v.scalar_type()).contiguous();
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), dsinks};
  }

 private:
  static variable_list FusedBackward(AutogradContext* ctx, const Geometry& g, PastKv* past, const at::Tensor& dout) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[4], &lse = saved[5];
    const std::array<at::Tensor, 2> aux = {saved[6], saved[7]};
    const FusedPlan plan{ctx->saved_data["fused_s0"].toInt(), ctx->saved_data["fused_window"].toInt()};
    const auto fused = static_cast<GpuAttentionKernel>(ctx->saved_data["fused_kernel"].toInt());
    const int64_t key_block =
        c10::static_intrusive_pointer_cast<PastHolder>(ctx->saved_data["past"].toCapsule())->key_block;
    const std::vector<Segment> blocks = FusedBlocks(g, plan, key_block);
    const at::Tensor dout4 = dout.unsqueeze(0).contiguous(), q4 = q.unsqueeze(0);
    at::Tensor dq = at::zeros(q4.sizes(), q.options().dtype(at::kFloat));
    at::Tensor dk, dv;
    for (size_t i = 0; i < blocks.size(); ++i) {
      auto [keys, values] = FusedBlockKv(blocks, i, past, k, v, /*backward=*/true);
      const BlockQueries seen = QueriesOf(g, plan, blocks[i]);
      const int64_t n = seen.rows;
      auto [dq_b, dkeys, dvalues] = FusedBlockBackward(
          fused, dout4.slice(1, 0, n), q4.slice(1, 0, n), keys.unsqueeze(0), values.unsqueeze(0), out.slice(1, 0, n),
          lse.slice(2, 0, n), /*causal=*/!blocks[i].past, aux, g.scale, seen.window);
      dq.slice(1, 0, n).add_(dq_b);
      if (blocks[i].past) {
        past->AccumulateGrad(blocks[i].begin, dkeys[0].to(at::kFloat).contiguous(),
                             dvalues[0].to(at::kFloat).contiguous());
      } else {
        dk = dkeys[0].permute({1, 0, 2}).contiguous();
        dv = dvalues[0].permute({1, 0, 2}).contiguous();
      }
    }
    if (past != nullptr) past->Finished(/*backward=*/true);
    const at::Tensor sinks = ctx->saved_data["sinks"].toTensor();
    at::Tensor dsinks;
    if (sinks.defined()) {
      const at::Tensor di = (dout4.to(at::kFloat) * out.to(at::kFloat)).sum(-1).transpose(1, 2);  // [1, Hq, C]
      dsinks = SinkGradTerms(lse, sinks.to(at::kFloat).view({1, g.Hq, 1}), di)
                   .sum(at::IntArrayRef{0, 2})
                   .to(sinks.scalar_type());
    }
    return {dq.squeeze(0).to(q.scalar_type()),
            dk,
            dv,
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            dsinks};
  }
};

}  // namespace

at::Tensor PagedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& doc_start,
                          std::shared_ptr<PastKv> past, int64_t key_block_tokens, GpuAttentionKernel kernel,
                          AttentionSwap swap, const at::Tensor& sinks) {
  return PagedAttentionFn::apply(q, k, v, doc_start, std::move(past), key_block_tokens, kernel, swap,
                                 SinksArgument(sinks));
}

at::Tensor SlidingWindowStart(const at::Tensor& doc_start, int64_t S, int64_t window) {
  TORCH_CHECK(window > 0, "SlidingWindowStart: window must be positive, got ", window);
  const at::Tensor first = at::arange(S - window + 1, S - window + 1 + doc_start.size(0), doc_start.options());
  return at::maximum(doc_start, first);
}

at::Tensor DenseAttentionReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& doc_start, const at::Tensor& sinks) {
  const int64_t T = q.size(0), Hq = q.size(1), Hkv = k.size(1), D = q.size(2);
  const at::Tensor kk = k.repeat_interleave(Hq / Hkv, 1).permute({1, 0, 2});  // [Hq, T, D]
  const at::Tensor vv = v.repeat_interleave(Hq / Hkv, 1).permute({1, 0, 2});
  at::Tensor scores = Matmul(q.permute({1, 0, 2}), kk.transpose(1, 2)) / std::sqrt(static_cast<double>(D));
  const at::Tensor j = at::arange(T, doc_start.options());
  const at::Tensor blocked = (j.unsqueeze(0) < doc_start.unsqueeze(1)) | (j.unsqueeze(0) > j.unsqueeze(1));
  scores = scores.masked_fill(blocked.unsqueeze(0), kNegInf);
  if (!sinks.defined()) return Matmul(at::softmax(scores, -1), vv).permute({1, 0, 2});
  const at::Tensor with_sinks =
      at::cat({scores, sinks.to(scores.scalar_type()).view({Hq, 1, 1}).expand({Hq, T, 1})}, -1);
  return Matmul(at::softmax(with_sinks, -1).narrow(-1, 0, T), vv).permute({1, 0, 2});
}

TensorPast::TensorPast(at::Tensor k, at::Tensor v) : k_(std::move(k)), v_(std::move(v)) {
  const auto acc = k_.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  dk = at::zeros(k_.sizes(), k_.options().dtype(acc));
  dv = at::zeros_like(dk);
}

}  // namespace oomb::kernels
