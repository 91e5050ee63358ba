#include "worker/model/tensor_parallel.h"

#include <algorithm>

namespace oomb {

std::vector<std::pair<int64_t, int64_t>> ShardRanges(const Split& s, int rank, int size) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t offset = 0;
  for (const int64_t part : s.parts) {
    const int64_t piece = s.uneven ? (part + size - 1) / size : part / size;
    const int64_t begin = std::min(part, rank * piece), end = std::min(part, (rank + 1) * piece);
    out.emplace_back(offset + begin, offset + end);
    offset += part;
  }
  return out;
}

bool Divides(const Split& s, int size) {
  return s.kind != Split::Kind::kSharded || s.uneven ||
         std::all_of(s.parts.begin(), s.parts.end(), [&](int64_t p) { return p % size == 0; });
}

at::Tensor TakeShard(const at::Tensor& whole, const Split& s, int rank, int size) {
  if (s.kind != Split::Kind::kSharded || size == 1 || !whole.defined()) return whole;
  std::vector<at::Tensor> pieces;
  for (const auto& [begin, end] : ShardRanges(s, rank, size)) pieces.push_back(whole.narrow(s.dim, begin, end - begin));
  // A copy, so that the whole tensor's memory goes once the caller lets it go.
  return at::cat(pieces, s.dim).detach().clone().set_requires_grad(whole.requires_grad());
}

at::Tensor GatherWhole(const at::Tensor& shard, const Split& s, const kernels::Collectives& group) {
  const int size = group.size();
  if (s.kind != Split::Kind::kSharded || size == 1 || !shard.defined()) return shard;
  // Pieces of an uneven split are padded to the first rank's size (every rank gathers one shape).
  const int64_t widest = ShardRanges(s, 0, size)[0].second - ShardRanges(s, 0, size)[0].first;
  at::Tensor padded = shard.detach();
  if (s.uneven && shard.size(s.dim) < widest) {
    std::vector<int64_t> pad_shape = shard.sizes().vec();
    pad_shape[s.dim] = widest - shard.size(s.dim);
    padded = at::cat({padded, at::zeros(pad_shape, shard.options())}, s.dim);
  }
  const std::vector<at::Tensor> all = group.AllGather(padded.contiguous());
  std::vector<at::Tensor> parts;  // part by part, each rank's piece of it in rank order
  for (size_t p = 0; p < s.parts.size(); ++p) {
    for (int r = 0; r < size; ++r) {
      const auto ranges = ShardRanges(s, r, size);
      int64_t offset = 0;  // where part p's piece starts in rank r's shard
      for (size_t q = 0; q < p; ++q) offset += ranges[q].second - ranges[q].first;
      parts.push_back(all[r].narrow(s.dim, offset, ranges[p].second - ranges[p].first));
    }
  }
  return at::cat(parts, s.dim);
}

}  // namespace oomb
