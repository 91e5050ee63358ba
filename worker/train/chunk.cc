#include "worker/train/chunk.h"

#include <algorithm>

#if defined(OOMB_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#endif

#include "kernels/torch/chunked_cross_entropy.h"
#include "kernels/torch/upload.h"

namespace oomb {
namespace {

at::Tensor I64(const std::vector<int64_t>& v, int64_t begin, int64_t end) {
  return at::tensor(at::ArrayRef<int64_t>(v.data() + begin, end - begin), at::kLong);
}

}  // namespace

Chunk MakeChunk(const Transformer& model, const TokenSequence& seq, int64_t index, int64_t chunk_tokens, bool training,
                uint64_t dropout_seed) {
  const int64_t rope_seq_len =
      seq.positions.empty() ? 0 : *std::max_element(seq.positions.begin(), seq.positions.end()) + 1;
  Chunk c;
  c.index = index;
  c.begin = index * chunk_tokens;
  c.end = std::min(seq.size(), c.begin + chunk_tokens);
  c.last = c.end == seq.size();
  c.doc_start_host = I64(seq.doc_start, c.begin, c.end);
  c.labels_host = I64(seq.labels, c.begin, c.end);
  c.label_tokens = c.labels_host.ne(kernels::kIgnoreIndex).sum().item<int64_t>();
  c.input.ids = kernels::Upload(I64(seq.ids, c.begin, c.end), model.device());
  c.input.positions = kernels::Upload(I64(seq.positions, c.begin, c.end), model.device());
  c.input.doc_start = kernels::Upload(c.doc_start_host, model.device());
  c.input.rope_seq_len = rope_seq_len;
  c.input.training = training;
  c.input.dropout_seed = dropout_seed * 1000003u + static_cast<uint64_t>(index);
  return c;
}

ChunkClock::ChunkClock(const at::Device& device) : cuda_(device.is_cuda()), device_index_(device.index()) { Mark(); }

void ChunkClock::Lap(std::vector<double>* out) {
  if (!cuda_) {
    const auto now = std::chrono::steady_clock::now();
    out->push_back(std::chrono::duration<double>(now - last_).count());
    last_ = now;
    return;
  }
  Mark();
  laps_.push_back(out);
}

void ChunkClock::Finish() {
#if defined(OOMB_HAVE_CUDA)
  if (!cuda_ || events_.empty()) return;
  events_.back().synchronize();
  for (size_t i = 0; i < laps_.size(); ++i) {
    laps_[i]->push_back(static_cast<double>(events_[i].elapsed_time(events_[i + 1])) / 1000.0);
  }
  laps_.clear();
#endif
}

void ChunkClock::Mark() {
  if (!cuda_) {
    last_ = std::chrono::steady_clock::now();
    return;
  }
#if defined(OOMB_HAVE_CUDA)
  events_.emplace_back(cudaEventDefault);
  events_.back().record(at::cuda::getCurrentCUDAStream(device_index_));
#endif
}

}  // namespace oomb
