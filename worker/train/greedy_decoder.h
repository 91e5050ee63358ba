// Greedy decoding over a sequence's KV pages: the prompt runs forward a span at a time, as
// training's stage 1 runs its chunks (each span attends over the tokens before it, read from the
// KV store by the dense attention strategy, worker/train/attention.h, and appends its own keys
// and values), then one token per forward. Memory grows with the cache (2 x layers x kv_dim
// values a token), never with the square of the prompt. Used by `oombd model generate`
// (worker/job/model_tools.h) and the RULER suite (ChunkTrainer::Generate).
//
// The pools must hold the KV of every token but the last generated one: a training plan for
// prompt + new tokens + one chunk (a plan leaves out a sequence's last chunk) holds them.
// Not thread-safe; one decoder per sequence, the pools shared with nothing running meanwhile.
#ifndef OOMB_WORKER_TRAIN_GREEDY_DECODER_H_
#define OOMB_WORKER_TRAIN_GREEDY_DECODER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/kv/kv_pools.h"
#include "worker/kv/kv_store.h"
#include "worker/model/transformer.h"
#include "worker/train/attention.h"

namespace oomb {

class GreedyDecoder {
 public:
  // `chunk_tokens`: the prompt's tokens per forward (at least 1).
  GreedyDecoder(const Transformer& model, const KvPools& pools, int64_t chunk_tokens);

  int64_t length() const { return length_; }

  // Tokens [length(), end) of `ids` (dynamic NTK's sequence length: `rope_len`, as transformers
  // uses the prompt's length for its tokens and then the length so far); the greedy next token
  // after them. RESOURCE_EXHAUSTED when the pools run out; LibTorch's errors are thrown (callers
  // run it inside their LibTorch boundary).
  absl::StatusOr<int64_t> Forward(const std::vector<int64_t>& ids, int64_t end, int64_t rope_len);

  // The greedy continuation of `prompt` (non-empty): up to `max_new_tokens` tokens, ending early
  // after `stop` when it comes. `on_prefill(done, prompt tokens)` after each prompt span (may be
  // empty). The decoder must be fresh.
  absl::StatusOr<std::vector<int64_t>> Continue(const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                                                std::optional<int64_t> stop,
                                                const std::function<void(int64_t, int64_t)>& on_prefill = {});

 private:
  const Transformer& model_;
  int64_t chunk_tokens_;
  KvStore store_;
  std::unique_ptr<Attention> attention_;
  int64_t length_ = 0;
};

}  // namespace oomb

#endif  // OOMB_WORKER_TRAIN_GREEDY_DECODER_H_
