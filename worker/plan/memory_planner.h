// The memory planner (docs/ARCHITECTURE.md §4): what a job needs on its device and on the host,
// and the longest context that fits, computed from the model's config.json and the job spec
// without running anything. Used by admission (CreateJob), EstimateJob / `oomb estimate` and
// `oombd model plan`. Torch-free.
//
// The model of the engine as it is built (worker/train/chunk_trainer.h, worker/job/executor.cc):
//
//   device peak = weights                       base weights in model.dtype
//               + trainable state               parameters, gradients and AdamW's two moments
//                                               (LoRA: float32 masters; full: model.dtype)
//               + device page pools             KV (model.dtype) and KV-gradient
//                                               (memory.kv_grad_dtype)
//                                               pages, allocated up front: of the sequence's
//                                               layers * (ceil(T' / P) + 1) pages each (T': the
//                                               tokens before the last chunk with dense
//                                               attention, which does not append it; T with
//                                               sparse), those placed on the device (below)
//               + one chunk's graph             what autograd keeps of one chunk's recomputed
//                                               forward through every layer (stage 2)
//               + workspace                     the largest transient: the LM head's logits
//                                               block, the backward of one layer, and the
//                                               attention's working set (CUDA: one key block
//                                               of the past, gathered, with its gradient;
//                                               CPU: one key block's scores)
//               + copies in flight              CUDA, with gradient pages on the host: sparse,
//                                               the copy engine's queued additions into them
//                                               (twice kHostAddBytesInFlight, worker/paging/page_id.h);
//                                               dense, one key block's gradient images written back
//
//   host peak   = host page pools               the pages not placed on the device, pinned
//               + sparse selections             (below)
//               + swapped attention results     memory.swap_attention, dense exact training: of
//                                               the host memory the rest leaves (CPU: of the one
//                                               budget), what the latest chunks' records take
//                                               (worker/paging/swap_layout.h), so it never limits
//                                               the context; whole chunks, pinned on a GPU
//
// Placement (memory.kv_offload, docs/ARCHITECTURE.md §4): none keeps every page on the device;
// host puts every page in the host tier; auto (the default) keeps on the device as many pages
// as fit beside everything else (less 1/16 of the device as a margin for the plan's error once
// pages spill), the same number of KV and KV-gradient pages, and places the rest on the host. The host's capacity is
// its RAM less kHostReserveBytes. On the CPU the device is the host: one budget, and auto places everything in the
// device pools.
//
// Every term is a function of T (the sequence length, data.max_seq_len) that does not
// decrease, so the longest context that fits is found by bisection. With the host tier the
// device peak stops growing with T (only the sparse summaries do, a few bytes per page): the
// host's memory sets the longest context. The per-token activation
// terms count the tensors autograd saves in Transformer::Hidden (see the .cc). Checked against
// measurement: on the CPU, weights, trainable state and pools to the byte and activations as an
// upper bound (tests/worker/plan/memory_planner_test.cc); on the GPU, bench/bench_train.cc
// prints the planned peak beside the measured one (planned_over_measured).
//
// SpaCO (backward.chunk_fraction p < 1): stage 1 keeps every KV page and a kept chunk of stage
// 2 needs what an exact one does, but only the kept chunks' pages get KV-gradient pages
// (ChunkTrainer::DropUnreadGradients). How many chunks a sequence keeps is drawn (each with
// probability p); the plan makes room for the gradient pages of SpacoKeptChunksBound of them,
// and a draw beyond that (probability at most kSpacoDrawTail) is refused before its step does
// any work.
//
// Sparse attention (attention.mode: sparse) keeps the same page pools (any page may be
// selected), adds the page summaries (counted with the activations), replaces the attention's
// working set by that of the selected pages (which does not grow with T: the past's pages
// attended per tile are bounded by page_budget), and keeps the selections on the host
// (peak_host_bytes).

#ifndef OOMB_WORKER_PLAN_MEMORY_PLANNER_H_
#define OOMB_WORKER_PLAN_MEMORY_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/hf/model_config.h"
#include "worker/paging/page_id.h"
#include "worker/plan/job_config.h"

namespace oomb {

// Where a job would run: the device's memory and the host's.
struct PlanTarget {
  std::string device = "cpu";  // "cpu" | "cuda:N"
  int64_t device_bytes = 0;    // total memory of the device (for "cpu": the host's RAM)
  int64_t host_bytes = 0;      // the host's RAM
  // The GPU's compute capability, major * 10 + minor: what decides the experts' path
  // (RunsGroupedExperts). 90 (a Hopper GPU) where the caller does not know it.
  int compute_capability = 90;
};

struct MemoryPlan {
  std::string device;
  int64_t seq_len = 0;                                // the sequence length planned for (data.max_seq_len)
  int64_t chunk_tokens = 0;                           // memory.chunk_tokens, auto's choice resolved
  KvGradDtype kv_grad_dtype = KvGradDtype::kFloat32;  // memory.kv_grad_dtype, auto's choice resolved

  int64_t weights_bytes = 0;          // base weights
  int64_t trainable_state_bytes = 0;  // trainable parameters + gradients + optimizer moments
  int64_t activation_bytes = 0;       // one chunk's graph + workspace
  int64_t kv_bytes = 0;               // KV + KV-gradient page pools at seq_len
  int64_t kv_device_bytes = 0;
  int64_t kv_host_bytes = 0;
  int64_t device_kv_pages = 0;     // KV pages placed on the device
  int64_t host_kv_pages = 0;       // KV pages placed on the host
  int64_t device_grad_pages = 0;   // KV-gradient pages placed on the device (as many as KV pages but under SpaCO)
  int64_t host_grad_pages = 0;     // KV-gradient pages placed on the host
  int64_t kv_bytes_per_token = 0;  // KV + KV-gradient bytes per token of context (all layers)

  int64_t peak_device_bytes = 0;
  int64_t peak_host_bytes = 0;        // what the plan places in host memory (for "cpu": everything)
  int64_t device_capacity_bytes = 0;  // usable: the device's memory less a fixed reserve
  int64_t host_capacity_bytes = 0;

  // Swap instead of recompute (memory.swap_attention; worker/paging/swap_layout.h): host bytes
  // for stage 1's attention results (in peak_host_bytes), the chunks of a data.max_seq_len
  // sequence they hold, and the fewest keys per query that make a chunk worth swapping.
  int64_t swap_bytes = 0;
  int64_t swap_chunks = 0;
  int64_t swap_min_key_tokens = 0;
  // Of a mixture of experts' sparse layers on grouped products with LoRA, how many (the first)
  // recompute the experts' gate_up product in backward rather than keep it
  // (Transformer::set_expert_recompute_layers): what lets memory.chunk_tokens auto take a larger
  // chunk, where the products cost fewer FLOPs than the stage-1 forward the larger chunk saves.
  int64_t expert_recompute_layers = 0;
  // What the plan chose where the spec leaves it the choice, and why, one line each (oomb
  // estimate prints them).
  std::vector<std::string> choices;

  bool fits = false;
  std::string limit;  // when !fits: which limit, in words, with the numbers
  // 0 when not even one token fits. With memory.kv_grad_dtype auto and a bfloat16 model: the
  // longest with bfloat16 KV-gradient pages (what auto picks at that length); with
  // memory.chunk_tokens auto, the longest of any of its candidates (the chunk auto picks there).
  int64_t max_seq_len_that_fits = 0;
  std::string placement;  // where the KV pages live, in words
};

// Memory kept back from a device's total for what the plan does not count: the CUDA context,
// cuBLAS / cuDNN workspaces, NCCL's communicators (several ranks) and the caching allocator's
// fragmentation (CPU: the OS and the process's code and libraries); what it holds was measured
// beside PyTorch's peak for one GPU and for 2 tensor-parallel ranks (docs/PERFORMANCE.md, "The
// planner's predictions").
inline constexpr int64_t kDeviceReserveBytes = int64_t{3} << 30;
// Host memory kept back from pinning: the OS, the daemon, the model while it loads, the page
// cache. (Measured: 112 GiB of a 128 GiB machine pinned, docs/ARCHITECTURE.md §4.)
inline constexpr int64_t kHostReserveBytes = int64_t{16} << 30;

// The plan of `job` on `target`, for the model `config` (the spec's model.path's
// config.json). memory.kv_grad_dtype auto is resolved first: float32 when its plan fits and
// (on a GPU) places no KV-gradient page in the host tier, else bfloat16 for a bfloat16 model
// (half the pages' PCIe traffic, or what fits), else float32. Then memory.chunk_tokens 0 (auto):
// the first of AutoChunkCandidates whose plan fits with a sixteenth of the device to spare, else
// the last. plan.kv_grad_dtype and plan.chunk_tokens are what was planned for, and plan.choices
// says why. With resources.gpus > 1 the plan is one rank's: the node's ranks share the host's
// pinned memory (and on the CPU its RAM) equally, and under parallel.tensor N a rank holds its
// shard of the model (ShardConfig, worker/hf/layer_spec.h).
absl::StatusOr<MemoryPlan> PlanMemory(const ModelConfig& config, const JobConfig& job, const PlanTarget& target);

// memory.chunk_tokens auto's candidates, largest first: the powers of two from kAutoChunkMax down
// to kAutoChunkMin, each rounded down to a multiple of `page_tokens` (at least one page).
inline constexpr int64_t kAutoChunkMax = 16384;
inline constexpr int64_t kAutoChunkMin = 1024;
std::vector<int64_t> AutoChunkCandidates(int64_t page_tokens);

// SpaCO: the number of kept chunks the plan makes room for when each of `chunks` chunks is
// kept with probability p: the smallest k with P(Binomial(chunks, p) > k) <= kSpacoDrawTail
// (`chunks` when p >= 1).
inline constexpr double kSpacoDrawTail = 1e-9;
int64_t SpacoKeptChunksBound(int64_t chunks, double p);

// The page pools `plan` places (worker/kv/kv_pools.h).
inline KvPoolSizes PoolSizes(const MemoryPlan& plan) {
  return {plan.device_kv_pages, plan.device_grad_pages, plan.host_kv_pages, plan.host_grad_pages};
}

// Bytes in words: "12.3 GiB".
std::string FormatBytes(int64_t bytes);

}  // namespace oomb

#endif  // OOMB_WORKER_PLAN_MEMORY_PLANNER_H_
