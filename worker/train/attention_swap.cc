#include "worker/train/attention_swap.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace oomb {
namespace {

// Bytes [offset, offset + bytes) of `memory`, as a tensor of `dtype` and `sizes`.
at::Tensor View(const at::Tensor& memory, int64_t offset, at::ScalarType dtype, at::IntArrayRef sizes) {
  int64_t elems = 1;
  for (const int64_t s : sizes) elems *= s;
  return memory.narrow(0, offset, elems * static_cast<int64_t>(c10::elementSize(dtype))).view(dtype).view(sizes);
}

}  // namespace

SwappedAttention::SwappedAttention(const Transformer* model, CopyEngine* copies, int64_t chunk_tokens,
                                   int64_t budget_bytes, int64_t min_key_tokens)
    : copies_(copies),
      layers_(model->config().num_layers),
      chunk_tokens_(chunk_tokens),
      layout_(MakeSwapLayout(
          chunk_tokens, model->local_heads(), model->config().head_dim,
          SwapOutputBytes(static_cast<int64_t>(c10::elementSize(model->dtype())), model->device().is_cuda()),
          min_key_tokens)) {
  const int64_t records = layout_.RecordsWithin(budget_bytes);
  memory_.reserve(static_cast<size_t>(records));
  for (int64_t i = 0; i < records; ++i) {
    try {
      memory_.push_back(copies_->HostBuffer(layout_.record_bytes));
    } catch (const c10::Error& e) {
      TORCH_WARN("attention swap: host memory for ", i, " of ", records, " records of ", layout_.record_bytes,
                 " bytes (", e.what_without_backtrace(), "); stage 2 recomputes the rest");
      break;
    }
  }
}

void SwappedAttention::BeginSequence(int64_t chunks) {
  EndSequence();
  const int64_t budget = static_cast<int64_t>(memory_.size()) * layout_.record_bytes;
  first_ = layout_.FirstSwappedChunk(chunks, chunk_tokens_, layers_, budget);
  end_ = std::max<int64_t>(first_, chunks - 1);
  records_.assign(static_cast<size_t>((end_ - first_) * layers_), Record());
}

void SwappedAttention::EndSequence() {
  first_ = end_ = 0;
  records_.clear();
  swapped_bytes_ = 0;
}

SwappedAttention::Record* SwappedAttention::Find(int64_t chunk, int64_t layer) {
  if (!Swaps(chunk) || layer < 0 || layer >= layers_) return nullptr;
  return &records_[static_cast<size_t>((chunk - first_) * layers_ + layer)];
}

void SwappedAttention::Keep(int64_t chunk, int64_t layer, const kernels::AttentionResult& result) {
  Record* r = Find(chunk, layer);
  if (r == nullptr) return;
  const at::Tensor out = result.out.contiguous(), lse = result.lse.contiguous();
  if (static_cast<int64_t>(out.nbytes()) > layout_.out_bytes ||
      layout_.out_bytes + static_cast<int64_t>(lse.nbytes()) > layout_.record_bytes) {
    return;  // not this layer: stage 2 recomputes it
  }
  const at::Tensor& memory = memory_[static_cast<size_t>((chunk - first_) * layers_ + layer)];
  r->out = View(memory, 0, out.scalar_type(), out.sizes());
  r->lse = View(memory, layout_.out_bytes, lse.scalar_type(), lse.sizes());
  copies_->WriteToHost(out, r->out);
  copies_->WriteToHost(lse, r->lse);
  r->aux = result.aux;
  r->kept = true;
  swapped_bytes_ += static_cast<int64_t>(out.nbytes() + lse.nbytes());
}

void SwappedAttention::StartUpload(int64_t chunk, int64_t layer) {
  Record* r = Find(chunk, layer);
  if (r == nullptr || !r->kept || r->out_up != nullptr) return;
  r->out_up = copies_->StartUpload(r->out);
  r->lse_up = copies_->StartUpload(r->lse);
}

std::optional<kernels::AttentionResult> SwappedAttention::Take(int64_t chunk, int64_t layer) {
  Record* r = Find(chunk, layer);
  if (r == nullptr || !r->kept) return std::nullopt;
  StartUpload(chunk, layer);
  kernels::AttentionResult result{copies_->Await(r->out_up), copies_->Await(r->lse_up), r->aux};
  r->out_up.reset();
  r->lse_up.reset();
  r->aux = {};
  StartUpload(chunk, layer + 1);
  return result;
}

int64_t SwappedAttention::swapped_chunks() const {
  int64_t n = 0;
  for (int64_t chunk = first_; chunk < end_; ++chunk) {
    const auto begin = records_.begin() + (chunk - first_) * layers_;
    n += std::all_of(begin, begin + layers_, [](const Record& r) { return r.kept; }) ? 1 : 0;
  }
  return n;
}

}  // namespace oomb
