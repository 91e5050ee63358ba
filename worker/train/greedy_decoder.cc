// Greedy decoding over KV pages: contract in worker/train/greedy_decoder.h.
#include "worker/train/greedy_decoder.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "kernels/torch/matmul.h"
#include "worker/common/status.h"
#include "worker/train/chunk.h"
#include "worker/train/torch_status.h"

namespace oomb {
namespace {

ChunkTrainerOptions DenseOptions(int64_t chunk_tokens) {
  ChunkTrainerOptions o;
  o.chunk_tokens = chunk_tokens;
  return o;
}

}  // namespace

// Sliding-window layers keep the pages some later token still reads (a span may start at any
// token): hence a reach of one-token chunks.
GreedyDecoder::GreedyDecoder(const Transformer& model, const KvPools& pools, int64_t chunk_tokens)
    : model_(model),
      chunk_tokens_(std::max<int64_t>(chunk_tokens, 1)),
      store_(pools, model.config().num_layers, PastReach{.windows = model.spec().Windows(), .chunk_tokens = 1}),
      attention_(MakeAttention(&model, pools, DenseOptions(chunk_tokens_))) {}

absl::StatusOr<int64_t> GreedyDecoder::Forward(const std::vector<int64_t>& ids, int64_t end, int64_t rope_len) {
  const at::Device device = model_.device();
  Chunk c;
  c.begin = length_;
  c.end = end;
  c.doc_start_host = at::zeros({end - c.begin}, at::kLong);  // one document
  c.input.ids = at::tensor(std::vector<int64_t>(ids.begin() + c.begin, ids.begin() + end), at::kLong).to(device);
  c.input.positions = at::arange(c.begin, end, at::TensorOptions().dtype(at::kLong).device(device));
  c.input.doc_start = c.doc_start_host.to(device);
  c.input.rope_seq_len = rope_len;
  const at::Tensor hidden =
      model_.Hidden(c.input, [&](int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
        absl::StatusOr<at::Tensor> out = attention_->Forward(c, layer, q, k, v, nullptr, store_);
        if (!out.ok()) throw StatusError(out.status());
        return *out;
      });
  length_ = end;
  return kernels::Matmul(hidden[end - c.begin - 1], model_.lm_head().t()).argmax().item<int64_t>();
}

absl::StatusOr<std::vector<int64_t>> GreedyDecoder::Continue(const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                                                             std::optional<int64_t> stop,
                                                             const std::function<void(int64_t, int64_t)>& on_prefill) {
  if (prompt.empty() || max_new_tokens < 1 || length_ != 0) {
    return absl::InvalidArgumentError(
        "GreedyDecoder::Continue: an empty prompt, no tokens to generate, or a used decoder");
  }
  at::NoGradGuard no_grad;
  std::vector<int64_t> ids = prompt, out;
  const auto prompt_tokens = static_cast<int64_t>(prompt.size());
  int64_t next = 0;
  for (int64_t begin = 0; begin < prompt_tokens; begin += chunk_tokens_) {
    const int64_t end = std::min(prompt_tokens, begin + chunk_tokens_);
    OOMB_ASSIGN_OR_RETURN(next, Forward(ids, end, prompt_tokens));
    if (on_prefill) on_prefill(end, prompt_tokens);
  }
  while (true) {
    out.push_back(next);
    ids.push_back(next);
    if ((stop.has_value() && next == *stop) || static_cast<int64_t>(out.size()) == max_new_tokens) break;
    OOMB_ASSIGN_OR_RETURN(next, Forward(ids, length_ + 1, length_ + 1));
  }
  return out;
}

}  // namespace oomb
