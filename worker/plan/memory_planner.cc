#include "worker/plan/memory_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/common/status.h"
#include "worker/hf/layer_spec.h"
#include "worker/paging/page_id.h"
#include "worker/paging/page_table.h"
#include "worker/paging/swap_layout.h"

namespace oomb {
namespace {

constexpr int64_t kF32 = 4;

// What the engine's kernels use (kernels/torch/paged_attention.cc, worker/train/chunk_trainer.h).
constexpr int64_t kCeRowsPerBlock = 1024;         // ChunkTrainerOptions::ce_rows_per_block
constexpr int64_t kCpuKeyBlock = 2048;            // ChunkTrainerOptions::attention_key_block
constexpr int64_t kCpuBlockScoreElems = 1 << 22;  // score elements of one attention block, CPU
constexpr int64_t kGpuKeyBlock = 16384;
constexpr int64_t kGpuBlockScoreElems = int64_t{1} << 27;
constexpr int64_t kGpuFlashKeyBlock = 65536;  // ChunkTrainerOptions::gpu_attention_key_block
// kv_offload auto, when pages spill to the host, and chunk_tokens auto leave 1/16 of the
// device's capacity unplanned:
// the plan's error, a few percent of the GPU peak, must not turn into an out-of-memory error at
// the step's peak.
constexpr int64_t kAutoMarginDivisor = 16;
// What the copy engine's additions into host pages hold on the device at most: the contributions
// queued (worker/paging/page_id.h), and as much again for the page images they are packed from.
// Only sparse backward adds this way (KvStore::AccumulatePageGrad); dense backward adds into a
// key block's page images (KvStore::AccumulateGrad; Model::GradWriteBackBytes).
constexpr int64_t kDeviceAddBytes = 2 * kHostAddBytesInFlight;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Everything that depends on the sequence length T, for a fixed model and spec.
class Model {
 public:
  Model(const ModelConfig& c, const JobConfig& job, const PlanTarget& target)
      : c_(c), layers_(DescribeModel(c)), job_(job), cuda_(target.device != "cpu") {
    e_ = job.model.dtype == ModelDtype::kFloat32 ? 4 : 2;
    exec_.elem_bytes = e_;
    exec_.fused_kernels = cuda_ && e_ == 2;
    exec_.expert_recompute_layers = job.memory.expert_recompute_layers;
    exec_.fused_norms =
        job.method.type != TrainMethod::kFull && (layers_.norm == NormKind::kRmsOnePlusWeight || exec_.fused_kernels);
    // evaluate is planned as the LoRA job of method.lora's shape: it runs the same chunks, and
    // its adapter (whatever its rank) is a small part of the weights.
    const bool lora = job.method.type != TrainMethod::kFull;
    const int64_t parameters = layers_.ParameterCount(c);
    std::vector<int64_t> expert_ranks;  // the adapted banks' LoRA ranks
    weights_ = parameters * e_;
    if (lora) {
      const JobConfig::Lora& spec = job.method.lora;
      exec_.lora_targets = ResolveLoraTargets(c, spec.target_modules).value_or(std::vector<std::string>{});
      exec_.lora_expert_targets = ResolveLoraExpertTargets(c, spec.target_modules, spec.target_parameters, spec.dropout)
                                      .value_or(std::vector<ExpertLoraTarget>{});
      exec_.lora_rank = job.method.lora.rank;
      exec_.lora_dropout = job.method.lora.dropout;
      int64_t lora_params = 0;
      for (const LayerSpec& layer : layers_.layers) {
        for (const LinearSpec& l : layer.Adapted(exec_.lora_targets))
          lora_params += job.method.lora.rank * (l.in + l.out);
        for (const auto& [b, factor] : layer.AdaptedExperts(exec_.lora_expert_targets))
          lora_params += job.method.lora.rank * factor * b.experts * (b.in + b.out);
      }
      // float32 masters, their gradients, AdamW's exp_avg and exp_avg_sq.
      trainable_ = lora_params * kF32 * 4;
      for (const ExpertLoraTarget& t : exec_.lora_expert_targets)
        expert_ranks.push_back(exec_.lora_rank * t.rank_factor);
    } else {
      // Parameters in model.dtype are the weights themselves: gradients and two moments more.
      trainable_ = parameters * e_ * 3;
    }
    // The experts' path the model takes on the plan's device (RunsGroupedExperts, the model's own
    // choice): the loop keeps each pair's input row and activation besides.
    exec_.grouped_experts = RunsGroupedExperts(
        {.cuda = cuda_, .compute_capability = target.compute_capability, .half_precision = e_ == 2, .elem_bytes = e_},
        ExpertInnerSizes(c, 1, expert_ranks));
  }

  int64_t weights() const { return weights_; }
  int64_t trainable() const { return trainable_; }

  // The sparse layers whose gate_up product backward can recompute (GroupedExpertMlp: grouped
  // products, LoRA, no biases; LayerSpec::SavedBytesPerToken), and what recomputing it in one of
  // them saves of a chunk of C tokens (bytes) and costs over T tokens (FLOPs).
  int64_t RecomputableLayers() const {
    if (!exec_.grouped_experts || exec_.lora_rank == 0) return 0;
    return std::count_if(layers_.layers.begin(), layers_.layers.end(),
                         [](const LayerSpec& l) { return l.moe.has_value() && !l.moe->biases; });
  }
  int64_t GateUpBytes(int64_t C) const { return C * c_.moe.top_k * 2 * c_.moe.intermediate * e_; }
  double GateUpFlops(int64_t T) const {
    return 2.0 * static_cast<double>(T) * c_.moe.top_k * c_.hidden_size * 2 * c_.moe.intermediate;
  }
  // The forward's FLOPs over T tokens (a third of training's).
  double ForwardFlops(int64_t T) const { return layers_.TrainingFlops(c_, T) / 3; }

  // KV pages (model.dtype) for a sequence of T tokens: the executor's pools, on the device and
  // the host together, for the PagedTokens; sliding-window layers hold only the pages later
  // chunks read (worker/paging/page_table.h).
  int64_t KvPages(int64_t T) const {
    return SequencePagesBound(PagedTokens(T), job_.memory.page_tokens, Reach(), c_.num_layers);
  }
  // The tokens of a T-token sequence that take pages: dense attention does not append the last
  // chunk, which no later chunk reads (worker/train/attention.h); sparse attention appends all.
  int64_t PagedTokens(int64_t T) const { return sparse() ? T : TokensBeforeLastChunk(T, job_.memory.chunk_tokens); }
  PastReach Reach() const { return PastReach{.windows = layers_.Windows(), .chunk_tokens = job_.memory.chunk_tokens}; }
  // KV-gradient pages. A layer attending its whole past: as many as its KV pages, but under
  // SpaCO (backward.chunk_fraction p < 1) only the pages of the chunks stage 2 keeps get them
  // (ChunkTrainer::DropUnreadGradients), and the plan makes room for SpacoKeptChunksBound of the
  // sequence's chunks. A sliding-window layer: stage 2 adds into the window before the chunk it
  // backpropagates, reads those pages back in the chunks before and frees them (ReleaseFrom), so
  // while chunk j runs, only tokens [s_j - W + 1, s_{j+1}) have gradient pages: the window
  // before chunk j and the one before chunk j + 1, min(W + C, 2 W) tokens, and a page more at
  // either end of each.
  int64_t GradPages(int64_t T) const {
    const double p = job_.chunk_fraction;
    const int64_t C = job_.memory.chunk_tokens, P = job_.memory.page_tokens, paged = PagedTokens(T);
    const int64_t per_chunk = C % P == 0 ? C / P : C / P + 2;  // the pages a chunk's tokens touch
    const int64_t global =
        p >= 1 ? CeilDiv(paged, P) + 1
               : std::min(CeilDiv(paged, P) + 1, SpacoKeptChunksBound(CeilDiv(T, C), p) * per_chunk + 1);
    int64_t pages = 0;
    for (const auto& [window, layers] : WindowLayers()) {
      const int64_t windows = CeilDiv(std::min(window + C, 2 * window), P) + 4;
      pages += layers * (window > 0 ? std::min(PagesKept(paged, P, window, C) + 1, windows) : global);
    }
    return pages;
  }
  // The layers of each attention window (0: the whole past).
  std::map<int64_t, int64_t> WindowLayers() const {
    std::map<int64_t, int64_t> out;
    for (const LayerSpec& l : layers_.layers) ++out[l.window];
    return out;
  }
  // One KV page (model.dtype), one KV-gradient page: bfloat16 when memory.kv_grad_dtype asks
  // and the model is bfloat16, else float32 (worker/kv/kv_pools.h, KvGradDtype).
  int64_t KvPageBytes() const { return 2 * c_.kv_dim() * job_.memory.page_tokens * e_; }
  int64_t GradElemBytes() const { return job_.memory.kv_grad_dtype == KvGradDtype::kBFloat16 && e_ == 2 ? 2 : kF32; }
  int64_t GradPageBytes() const { return 2 * c_.kv_dim() * job_.memory.page_tokens * GradElemBytes(); }
  int64_t KvBytes(int64_t T) const { return KvPages(T) * KvPageBytes() + GradPages(T) * GradPageBytes(); }
  // Dense backward with gradient pages on the host: the gradient images of a key block, in the
  // pages' dtype, are written back while the next block is added to, and the copy engine holds
  // them until the copy is done (CopyEngine::WritePages): two blocks' (the newest queued behind
  // the one being copied), the most measured (docs/PERFORMANCE.md, "The planner's predictions").
  int64_t GradWriteBackBytes(int64_t T) const {
    const int64_t block = cuda_ && e_ == 2 ? kGpuFlashKeyBlock : kGpuKeyBlock;
    return std::min(T, 2 * block) * c_.kv_dim() * 2 * GradElemBytes();
  }

  // What autograd keeps of one chunk of C tokens (ModelSpec::SavedBytesPerToken: block by block,
  // as the layer description declares it).
  int64_t GraphBytes(int64_t C) const { return C * layers_.SavedBytesPerToken(c_, exec_); }

  // The largest transient on top of the graph. T: tokens up to and including the chunk.
  int64_t WorkspaceBytes(int64_t C, int64_t T) const {
    const int64_t H = c_.hidden_size, KV = c_.kv_dim(), I = c_.intermediate_size;
    // LM head + cross-entropy: one block of logits in dtype, which the GPU kernel turns into its
    // gradient in place (the CPU's composite ops: beside a float32 copy and gradient), and the
    // chunk's hidden-state gradient, which forward computes and backward scales.
    const int64_t ce_elem = cuda_ && e_ == 2 ? e_ : e_ + 2 * kF32;
    const int64_t ce = std::min(C, kCeRowsPerBlock) * c_.vocab_size * ce_elem + C * H * e_;
    // One layer's backward: gradients of the MLP's intermediates and of the residual stream.
    int64_t layer_backward = C * (3 * I + 4 * H) * e_;
    for (const LayerSpec& layer : layers_.layers) {
      if (!layer.moe.has_value()) continue;
      // A mixture of experts: those of the top_k pairs of each token; in full fine-tuning also
      // the gradient of a whole expert bank, gathered from its experts' at once.
      const MoeSpec& moe = *layer.moe;
      const int64_t bank = job_.method.type == TrainMethod::kFull ? 2 * moe.intermediate * H * moe.experts * e_ : 0;
      layer_backward = std::max(layer_backward, C * moe.top_k * (3 * moe.intermediate + 4 * H) * e_ + bank);
    }
    // Attention. Blockwise path: the float32 scores of one block of queries against one block
    // of keys, and what is made from them (probabilities, their gradient, temporaries): 3.5
    // blocks, the most measured on the CPU (tests/worker/plan/memory_planner_test.cc).
    const int64_t key_block = cuda_ ? kGpuKeyBlock : kCpuKeyBlock;
    const int64_t block_elems =
        std::min(cuda_ ? kGpuBlockScoreElems : kCpuBlockScoreElems, c_.num_heads * C * std::min(T, key_block));
    const int64_t blockwise = 7 * kF32 * block_elems / 2;
    // Fused path, one key block of the past at a time: its pages' images (host pages come in as
    // images), the block gathered and laid out for flash, and in backward its dK/dV from the
    // kernel (dtype) and converted to float32; bfloat16 KV-gradient pages add their images while
    // the block's gradient is added into them, read (bfloat16) and widened (float32) or written
    // back (float32 and rounded) (KvStore::AccumulateGrad). `past`: the keys a layer reads.
    const int64_t grad_images = GradElemBytes() < kF32 ? 2 * (GradElemBytes() + kF32) : 0;
    const auto dense = [&](int64_t past) {
      return cuda_ && e_ == 2
                 ? std::max(blockwise, std::min(past, kGpuFlashKeyBlock) * KV * (6 * e_ + 2 * kF32 + grad_images))
                 : blockwise;
    };
    int64_t attention = dense(T);
    if (sparse()) {
      // Sliding-window layers attend densely over their window (and the chunk).
      attention = SparseAttentionBytes(C, T);
      for (const auto& [window, layers] : WindowLayers()) {
        if (window > 0) attention = std::max(attention, dense(std::min(T, window + C)));
      }
    }
    return std::max({ce, layer_backward, attention});
  }

  bool sparse() const { return job_.sparse.has_value(); }

  // Sparse attention (kernels/torch/sparse_attention.cc) of a chunk of C tokens ending at T:
  // the selected pages gathered per (query tile, KV head), keys and values, G elements each.
  // CUDA: in backward those and their dK/dV from the kernel (dtype), which AccumulatePageGrad
  // adds into the pages in place (2 e + 2 e per element). CPU: also their float32 gradients,
  // and one tile's float32 scores and what is made from them (3.5x).
  int64_t SparseAttentionBytes(int64_t C, int64_t T) const {
    const int64_t P = job_.memory.page_tokens, D = c_.head_dim, Hkv = c_.num_kv_heads;
    const int64_t tiles = CeilDiv(C, P);
    const int64_t selected = std::min(CeilDiv(T, P), job_.sparse->page_budget);
    const int64_t gathered = tiles * Hkv * selected * P * D;
    if (cuda_ && e_ == 2) return gathered * 4 * e_;
    const int64_t tile_scores = c_.num_heads * P * (selected * P + C);
    return gathered * 5 * kF32 + 7 * kF32 * tile_scores / 2;
  }

  // The layers that attend their whole past (sparse attention selects pages only in those).
  int64_t GlobalLayers() const {
    const auto windows = WindowLayers();
    const auto it = windows.find(0);
    return it == windows.end() ? 0 : it->second;
  }

  // Sparse attention's page summaries: every global layer, every page, (min and max or mean)
  // per KV head, in the KV pages' dtype.
  int64_t SummaryBytes(int64_t T) const {
    if (!sparse()) return 0;
    const int64_t per = job_.sparse->selection == PageSummaryKind::kMinMax ? 2 : 1;
    return GlobalLayers() * CeilDiv(T, job_.memory.page_tokens) * per * c_.kv_dim() * e_;
  }

  // Sparse attention's selections of the global layers, kept on the host from stage 1 to
  // stage 2 (int32).
  int64_t SelectionHostBytes(int64_t T) const {
    if (!sparse()) return 0;
    const int64_t P = job_.memory.page_tokens, C = std::min(T, job_.memory.chunk_tokens);
    const int64_t per_chunk =
        CeilDiv(C, P) * c_.num_kv_heads * std::min(CeilDiv(T, P), job_.sparse->page_budget) * kF32;
    return CeilDiv(T, C) * GlobalLayers() * per_chunk;
  }

  // Everything on the device but the page pools.
  int64_t DeviceFixed(int64_t T) const {
    const int64_t C = std::min(T, job_.memory.chunk_tokens);
    return weights_ + trainable_ + SummaryBytes(T) + GraphBytes(C) + WorkspaceBytes(C, T);
  }

 private:
  const ModelConfig& c_;
  const ModelSpec layers_;
  const JobConfig& job_;
  const bool cuda_;
  Execution exec_;  // how the layers run: what their blocks keep for backward
  int64_t e_ = 2;
  int64_t weights_ = 0;
  int64_t trainable_ = 0;
};

// Where the pages of a T-token sequence go, and the peaks that follow.
struct Placement {
  int64_t device_pages = 0, device_grad_pages = 0;  // KV pages, KV-gradient pages
  int64_t host_pages = 0, host_grad_pages = 0;
  int64_t device_page_bytes = 0, host_page_bytes = 0;
  int64_t peak_device = 0;
  int64_t peak_host = 0;
  bool fits = false;
};

Placement Place(const Model& m, const JobConfig& job, bool cuda, int64_t T, int64_t device_capacity,
                int64_t host_capacity) {
  Placement p;
  const int64_t pages = m.KvPages(T), grad_pages = m.GradPages(T), fixed = m.DeviceFixed(T);
  const KvOffload offload = job.memory.kv_offload;
  // With gradient pages on the host: what the copy engine holds on the device for them.
  const int64_t in_flight = !cuda ? 0 : m.sparse() ? kDeviceAddBytes : m.GradWriteBackBytes(T);
  // The share of both kinds of pages kept on the device.
  double on_device = 1;
  if (offload == KvOffload::kHost) {
    on_device = 0;
  } else if (offload == KvOffload::kAuto && cuda && fixed + m.KvBytes(T) > device_capacity) {
    // What fits stays on the device, less a margin for the plan's own error and the additions
    // into host pages in flight.
    const int64_t margin = device_capacity / kAutoMarginDivisor;
    on_device = std::clamp(
        static_cast<double>(device_capacity - fixed - in_flight - margin) / static_cast<double>(m.KvBytes(T)), 0.0,
        1.0);
  }
  p.device_pages = static_cast<int64_t>(on_device * static_cast<double>(pages));
  p.device_grad_pages = static_cast<int64_t>(on_device * static_cast<double>(grad_pages));
  p.host_pages = pages - p.device_pages;
  p.host_grad_pages = grad_pages - p.device_grad_pages;
  p.device_page_bytes = p.device_pages * m.KvPageBytes() + p.device_grad_pages * m.GradPageBytes();
  p.host_page_bytes = p.host_pages * m.KvPageBytes() + p.host_grad_pages * m.GradPageBytes();
  p.peak_device = fixed + p.device_page_bytes;
  // The copy engine's additions or write-backs into host gradient pages in flight
  // (worker/kv/copy_engine.h).
  if (p.host_grad_pages > 0) p.peak_device += in_flight;
  p.peak_host = p.host_page_bytes + m.SelectionHostBytes(T);
  // On the CPU the device is the host: one budget.
  if (!cuda) p.peak_host += p.peak_device;
  p.fits = p.peak_device <= device_capacity && (!cuda ? p.peak_host <= device_capacity : p.peak_host <= host_capacity);
  return p;
}

// Swap instead of recompute: the records of the latest chunks of a T-token sequence that the
// host memory left over holds (`left`: after everything else the plan places there), in whole
// chunks; none for sparse attention, SpaCO or evaluation.
// On a GPU whose plan keeps every KV page on the device, nothing else crosses the bus: the
// records' copies overlap the trainer's kernels (queued a layer ahead), and every chunk is worth
// swapping; with pages on the host the records share the bus with them (SwapMinKeyTokens).
void PlanSwap(const ModelConfig& c, const JobConfig& job, bool cuda, bool pages_on_host, int64_t T, int64_t left,
              MemoryPlan* plan) {
  const int64_t C = job.memory.chunk_tokens, chunks = CeilDiv(T, C), L = c.num_layers;
  const char* off = nullptr;
  if (!job.memory.swap_attention) off = "memory.swap_attention is false";
  if (job.sparse.has_value()) off = "sparse attention recomputes with its selections";
  if (job.chunk_fraction < 1) off = "backward.chunk_fraction < 1 (SpaCO)";
  if (job.method.type == TrainMethod::kEvaluate) off = "method.type evaluate does not train";
  if (chunks <= 1) off = "a sequence of one chunk runs once, in stage 2";
  if (off != nullptr) {
    plan->choices.push_back(
        absl::StrCat("attention swap: none (", off, "); stage 2 recomputes every attention forward"));
    return;
  }
  const int64_t e = job.model.dtype == ModelDtype::kFloat32 ? 4 : 2;
  const SwapLayout layout = MakeSwapLayout(C, c.num_heads, c.head_dim, SwapOutputBytes(e, cuda),
                                           cuda && pages_on_host ? SwapMinKeyTokens(e) : 0);
  const int64_t none = std::max<int64_t>(0, chunks - 1);
  const int64_t worth = none - layout.FirstSwappedChunk(chunks, C, L, std::numeric_limits<int64_t>::max());
  const int64_t chunk_bytes = L * layout.record_bytes;
  plan->swap_chunks = std::min(worth, std::max<int64_t>(0, left) / chunk_bytes);
  plan->swap_bytes = plan->swap_chunks * chunk_bytes;
  plan->swap_min_key_tokens = layout.min_key_tokens;
  std::string why = absl::StrCat(worth, " of the ", none, " chunks stage 2 recomputes are worth swapping");
  if (layout.min_key_tokens > 0 && worth < none) {
    absl::StrAppend(&why, " (with KV pages crossing PCIe too, a chunk whose attention reads fewer than ",
                    layout.min_key_tokens, " keys per query recomputes faster than its records cross it)");
  }
  if (plan->swap_chunks < worth) {
    absl::StrAppend(&why, "; the host memory the plan leaves (", FormatBytes(std::max<int64_t>(0, left)), ") holds ",
                    plan->swap_chunks);
  }
  plan->choices.push_back(absl::StrCat("attention swap: the last ", plan->swap_chunks, " chunks' attention results (",
                                       FormatBytes(plan->swap_bytes), cuda ? " pinned" : "",
                                       " host memory) instead of recomputing them: ", why));
}

}  // namespace

int64_t SpacoKeptChunksBound(int64_t chunks, double p) {
  if (p >= 1 || chunks <= 0) return std::max<int64_t>(chunks, 0);
  // Walk the upper tail down from mean + 20 sd + 40, beyond which the binomial's mass is below
  // 1e-26 (Bernstein's inequality), until it reaches kSpacoDrawTail.
  const double n = static_cast<double>(chunks), sd = std::sqrt(n * p * (1 - p));
  const int64_t top = std::min<int64_t>(chunks, static_cast<int64_t>(std::ceil(n * p + 20 * sd + 40)));
  const auto log_pmf = [&](int64_t j) {
    const double k = static_cast<double>(j);
    return std::lgamma(n + 1) - std::lgamma(k + 1) - std::lgamma(n - k + 1) + k * std::log(p) +
           (n - k) * std::log1p(-p);
  };
  double tail = 0;  // P(j < K <= top)
  for (int64_t j = top; j > 0; --j) {
    tail += std::exp(log_pmf(j));
    if (tail > kSpacoDrawTail) return j;
  }
  return 0;
}

std::string FormatBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

namespace {

// Why `plan` does not fit, in words, with the numbers (`host_pages`, `host_grad_pages`: the
// pages it places on the host).
std::string LimitInWords(const MemoryPlan& plan, int64_t host_pages, int64_t host_grad_pages, const JobConfig& job,
                         const PlanTarget& target) {
  const int64_t lo = plan.max_seq_len_that_fits;
  const std::string longest = lo > 0 ? absl::StrCat("the longest context that fits is ", lo, " tokens")
                                     : std::string("not even one token fits");
  if (plan.peak_device_bytes > plan.device_capacity_bytes) {
    return absl::StrCat(
        target.device, " memory: the job needs ", FormatBytes(plan.peak_device_bytes), " at data.max_seq_len ",
        plan.seq_len, " (weights ", FormatBytes(plan.weights_bytes), ", KV pages ", FormatBytes(plan.kv_device_bytes),
        ", activations ", FormatBytes(plan.activation_bytes), ") and ", FormatBytes(plan.device_capacity_bytes),
        " is usable (", FormatBytes(target.device_bytes), " less ", FormatBytes(kDeviceReserveBytes), " reserved); ",
        longest,
        job.memory.kv_offload == KvOffload::kNone ? " (memory.kv_offload: none keeps every page on the device)" : "");
  }
  return absl::StrCat("host memory: the job needs ", FormatBytes(plan.peak_host_bytes),
                      " of pinned host memory at data.max_seq_len ", plan.seq_len, " (", host_pages, " KV and ",
                      host_grad_pages, " KV-gradient pages) and ", FormatBytes(plan.host_capacity_bytes),
                      " is usable (", FormatBytes(target.host_bytes), " less ", FormatBytes(kHostReserveBytes),
                      " reserved); ", longest);
}

// resources.gpus > 1 ranks on the node: one rank's plan, with its share of the memory the ranks
// share: the host's pinned tier (each rank pins its own), and on the CPU the device's too; under
// parallel.tensor N > 1, of its shard of the model (ShardConfig).
absl::StatusOr<MemoryPlan> PlanRank(const ModelConfig& config, const JobConfig& requested, const PlanTarget& target) {
  const int n = requested.parallel.tensor, ranks = std::max(1, requested.resources.gpus);
  if (n > 1) OOMB_RETURN_IF_ERROR(Annotate(CheckTensorParallel(config, n), "parallel.tensor"));
  JobConfig one = requested;
  one.parallel.tensor = 1;
  one.resources.gpus = 1;
  PlanTarget rank = target;
  rank.host_bytes = kHostReserveBytes + std::max<int64_t>(0, target.host_bytes - kHostReserveBytes) / ranks;
  if (target.device == "cpu") {
    rank.device_bytes = kDeviceReserveBytes + std::max<int64_t>(0, target.device_bytes - kDeviceReserveBytes) / ranks;
  }
  OOMB_ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(n > 1 ? ShardConfig(config, n) : config, one, rank));
  const std::string share = absl::StrCat("1/", ranks, " of the host's pinned memory (", ranks, " ranks on the node)");
  plan.choices.insert(
      plan.choices.begin(),
      n > 1 ? absl::StrCat("parallel.tensor ", n, ": the plan of one rank, its 1/", n,
                           " of the heads, KV heads, MLP features and vocabulary, and ", share)
            : absl::StrCat("resources.gpus ", ranks, ": the plan of one data-parallel rank, with ", share));
  return plan;
}

}  // namespace

std::vector<int64_t> AutoChunkCandidates(int64_t page_tokens) {
  std::vector<int64_t> out;
  for (int64_t c = kAutoChunkMax; c >= kAutoChunkMin; c /= 2) {
    const int64_t multiple = std::max(page_tokens, c / page_tokens * page_tokens);
    if (out.empty() || out.back() != multiple) out.push_back(multiple);
  }
  return out;
}

namespace {

// The longest sequence whose pages and peaks fit (neither peak decreases with T: a bisection).
int64_t LongestThatFits(const Model& m, const JobConfig& job, bool cuda, int64_t device_capacity,
                        int64_t host_capacity) {
  int64_t lo = 0, hi = int64_t{1} << 31;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (Place(m, job, cuda, mid, device_capacity, host_capacity).fits) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// memory.chunk_tokens auto: the first of AutoChunkCandidates whose plan fits with a sixteenth of
// the device to spare (the smallest when none does; its plan then says what does not fit), with
// *recompute_layers the sparse layers that recompute their experts' gate_up product for it.
absl::StatusOr<int64_t> ChooseChunkTokens(const ModelConfig& config, const JobConfig& job, const PlanTarget& target,
                                          std::string* why, int64_t* recompute_layers) {
  const std::vector<int64_t> candidates = AutoChunkCandidates(job.memory.page_tokens);
  const int64_t capacity = std::max<int64_t>(0, target.device_bytes - kDeviceReserveBytes);
  const int64_t limit = capacity - capacity / kAutoMarginDivisor, T = job.data.max_seq_len;
  *recompute_layers = 0;
  for (const int64_t c : candidates) {
    JobConfig trial = job;
    trial.memory.chunk_tokens = c;
    trial.memory.expert_recompute_layers = 0;
    OOMB_ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(config, trial, target));
    // A mixture of experts: the gate_up products recomputed in as many sparse layers as bring the
    // peak within the margin, where they cost fewer FLOPs than the stage-1 forward of the tokens
    // the next smaller chunk would add to stage 1 (all but the last chunk run there).
    const Model m(config, trial, target);
    const int64_t C = std::min(T, c), stage1_added = c / 2 * (CeilDiv(T, c / 2) - 1) - C * (CeilDiv(T, C) - 1);
    while (plan.fits && plan.peak_device_bytes > limit && m.GateUpBytes(C) > 0 &&
           trial.memory.expert_recompute_layers < m.RecomputableLayers()) {
      const int64_t n =
          std::max(trial.memory.expert_recompute_layers + 1, CeilDiv(plan.peak_device_bytes - limit, m.GateUpBytes(C)));
      if (n > m.RecomputableLayers() || n * m.GateUpFlops(T) >= m.ForwardFlops(stage1_added)) break;
      trial.memory.expert_recompute_layers = n;
      OOMB_ASSIGN_OR_RETURN(plan, PlanMemory(config, trial, target));
    }
    if (plan.fits && plan.peak_device_bytes <= limit) {
      *why = absl::StrCat("memory.chunk_tokens auto: ", c, ", the largest of ", absl::StrJoin(candidates, ", "),
                          " whose plan leaves a sixteenth of ", target.device, " free at ", T,
                          " tokens (larger chunks run faster: fewer, larger matmuls and less of stage 1)");
      if (trial.memory.expert_recompute_layers > 0) {
        absl::StrAppend(why, ", with the experts' gate_up products recomputed in backward in ",
                        trial.memory.expert_recompute_layers, " of ", m.RecomputableLayers(),
                        " sparse layers (fewer FLOPs than the stage-1 forward of the ", stage1_added,
                        " tokens chunks of ", c / 2, " would add)");
      }
      *recompute_layers = trial.memory.expert_recompute_layers;
      return c;
    }
  }
  *why = absl::StrCat("memory.chunk_tokens auto: ", candidates.back(), ", the smallest of ",
                      absl::StrJoin(candidates, ", "), "; none leaves a sixteenth of ", target.device, " free at ",
                      job.data.max_seq_len, " tokens");
  return candidates.back();
}

// memory.kv_grad_dtype auto (PlanMemory's contract): both plans, and the one it picks, with why.
absl::StatusOr<MemoryPlan> PlanAutoGradDtype(const ModelConfig& config, const JobConfig& job,
                                             const PlanTarget& target) {
  JobConfig trial = job;
  trial.memory.kv_grad_dtype = KvGradDtype::kFloat32;
  OOMB_ASSIGN_OR_RETURN(MemoryPlan exact, PlanMemory(config, trial, target));
  const std::string prefix = "memory.kv_grad_dtype auto: ";
  if (job.model.dtype != ModelDtype::kBFloat16) {
    exact.choices.push_back(absl::StrCat(prefix, "float32, as the model's dtype"));
    return exact;
  }
  trial.memory.kv_grad_dtype = KvGradDtype::kBFloat16;
  OOMB_ASSIGN_OR_RETURN(MemoryPlan half, PlanMemory(config, trial, target));
  const bool cuda = target.device != "cpu";
  const int64_t T = job.data.max_seq_len;
  if (exact.fits && !(cuda && exact.host_grad_pages > 0)) {
    exact.max_seq_len_that_fits = std::max(exact.max_seq_len_that_fits, half.max_seq_len_that_fits);
    exact.choices.push_back(absl::StrCat(
        prefix, "float32, ",
        cuda ? absl::StrCat("every KV-gradient page stays on ", target.device) : std::string("its pages fit"), " at ",
        T, " tokens"));
    return exact;
  }
  half.choices.push_back(
      absl::StrCat(prefix, "bfloat16 (accumulated in float32, stored rounded), ",
                   exact.fits ? absl::StrCat(exact.host_grad_pages, " KV-gradient pages go to the host tier at ", T,
                                             " tokens: bfloat16 halves their PCIe traffic")
                              : absl::StrCat("float32 pages do not fit at ", T, " tokens")));
  return half;
}

// What the job asks of the model that the model has: a router for router_aux_loss_coef, the
// LoRA targets, a whole model for full fine-tuning.
absl::Status CheckJobAgainstModel(const ModelConfig& config, const JobConfig& job) {
  if (job.model.router_aux_loss_coef.has_value() && config.moe.experts == 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.router_aux_loss_coef: ", job.model.path,
                                                   " has no experts (no router to balance); leave the field out"));
  }
  if (job.method.type == TrainMethod::kLora) {
    const JobConfig::Lora& l = job.method.lora;
    OOMB_RETURN_IF_ERROR(ResolveLoraTargets(config, l.target_modules).status());
    OOMB_RETURN_IF_ERROR(ResolveLoraExpertTargets(config, l.target_modules, l.target_parameters, l.dropout).status());
  } else if (job.method.type == TrainMethod::kEvaluate) {
    OOMB_RETURN_IF_ERROR(ResolveLoraTargets(config, job.method.lora.target_modules).status());
  } else if (config.multimodal_text) {
    return absl::InvalidArgumentError(absl::StrCat(
        "method.type: full fine-tuning of the language model of ", job.model.path,
        " (a vision-language checkpoint) would write a model without its vision tower; train it with lora"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MemoryPlan> PlanMemory(const ModelConfig& config, const JobConfig& requested, const PlanTarget& target) {
  if (requested.parallel.tensor > 1 || requested.resources.gpus > 1) return PlanRank(config, requested, target);
  if (requested.memory.kv_grad_dtype == KvGradDtype::kAuto) return PlanAutoGradDtype(config, requested, target);
  JobConfig job = requested;
  std::string chunk_choice;
  if (job.memory.chunk_tokens <= 0) {
    OOMB_ASSIGN_OR_RETURN(job.memory.chunk_tokens,
                          ChooseChunkTokens(config, job, target, &chunk_choice, &job.memory.expert_recompute_layers));
  }
  const bool cuda = target.device != "cpu";
  OOMB_RETURN_IF_ERROR(CheckJobAgainstModel(config, job));
  const Model m(config, job, target);

  MemoryPlan plan;
  plan.device = target.device;
  plan.seq_len = job.data.max_seq_len;
  plan.chunk_tokens = job.memory.chunk_tokens;
  plan.kv_grad_dtype = job.memory.kv_grad_dtype;
  plan.expert_recompute_layers = job.memory.expert_recompute_layers;
  plan.choices = job.choices;
  if (!chunk_choice.empty()) plan.choices.push_back(chunk_choice);
  plan.weights_bytes = m.weights();
  plan.trainable_state_bytes = m.trainable();
  const int64_t T = plan.seq_len;
  const int64_t C = std::min(T, job.memory.chunk_tokens);
  plan.activation_bytes = m.GraphBytes(C) + m.WorkspaceBytes(C, T) + m.SummaryBytes(T);
  plan.kv_bytes = m.KvBytes(T);
  // Per token of context: over 1M tokens past the first chunk (whose pages dense attention
  // never takes, when it is the last).
  plan.kv_bytes_per_token = (m.KvBytes((1 << 20) + job.memory.chunk_tokens) - m.KvBytes(job.memory.chunk_tokens)) >> 20;
  plan.device_capacity_bytes = std::max<int64_t>(0, target.device_bytes - kDeviceReserveBytes);
  plan.host_capacity_bytes = std::max<int64_t>(0, target.host_bytes - kHostReserveBytes);
  const Placement p = Place(m, job, cuda, T, plan.device_capacity_bytes, plan.host_capacity_bytes);
  plan.kv_device_bytes = p.device_page_bytes;
  plan.kv_host_bytes = p.host_page_bytes;
  plan.device_kv_pages = p.device_pages;
  plan.host_kv_pages = p.host_pages;
  plan.device_grad_pages = p.device_grad_pages;
  plan.host_grad_pages = p.host_grad_pages;
  plan.peak_device_bytes = p.peak_device;
  plan.peak_host_bytes = p.peak_host;
  plan.placement =
      p.host_pages == 0
          ? absl::StrCat("KV and KV-gradient pages on ", target.device)
          : absl::StrCat(p.device_pages, " KV and ", p.device_grad_pages, " KV-gradient pages on ", target.device, ", ",
                         p.host_pages, " KV and ", p.host_grad_pages, " KV-gradient pages in the host tier (",
                         FormatBytes(plan.kv_host_bytes), cuda ? ", pinned)" : ")");
  if (job.chunk_fraction < 1) {
    absl::StrAppend(&plan.placement, "; KV-gradient pages for ",
                    SpacoKeptChunksBound(CeilDiv(T, job.memory.chunk_tokens), job.chunk_fraction), " of ",
                    CeilDiv(T, job.memory.chunk_tokens), " chunks (backward.chunk_fraction ", job.chunk_fraction, ")");
  }

  plan.max_seq_len_that_fits = LongestThatFits(m, job, cuda, plan.device_capacity_bytes, plan.host_capacity_bytes);
  if (requested.memory.chunk_tokens <= 0) {
    // auto: a longer sequence gets a smaller chunk (ChooseChunkTokens), so the longest context is
    // the longest any candidate fits.
    for (const int64_t c : AutoChunkCandidates(job.memory.page_tokens)) {
      JobConfig trial = job;
      trial.memory.chunk_tokens = c;
      trial.memory.expert_recompute_layers = 0;
      plan.max_seq_len_that_fits =
          std::max(plan.max_seq_len_that_fits, LongestThatFits(Model(config, trial, target), trial, cuda,
                                                               plan.device_capacity_bytes, plan.host_capacity_bytes));
    }
  }
  plan.fits = p.fits;
  if (p.fits) {
    PlanSwap(config, job, cuda, p.host_pages + p.host_grad_pages > 0, T,
             cuda ? plan.host_capacity_bytes - p.peak_host : plan.device_capacity_bytes - p.peak_host, &plan);
    plan.peak_host_bytes += plan.swap_bytes;
  }
  if (!plan.fits) plan.limit = LimitInWords(plan, p.host_pages, p.host_grad_pages, job, target);
  return plan;
}

}  // namespace oomb
