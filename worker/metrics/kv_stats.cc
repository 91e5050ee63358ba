#include "worker/metrics/kv_stats.h"

#include <algorithm>
#include <iterator>

namespace oomb {

const char* DirectionName(TransferDirection d) { return d == TransferDirection::kDeviceToHost ? "d2h" : "h2d"; }

std::shared_ptr<PoolCounters> KvStatsRegistry::AddPool(const std::string& slot, Tier tier, PageKind kind,
                                                       int64_t capacity_pages, int64_t bytes_per_page) {
  auto counters = std::make_shared<PoolCounters>(capacity_pages, bytes_per_page);
  absl::MutexLock lock(&mu_);
  pools_.push_back(PoolEntry{slot, tier, kind, counters});
  return counters;
}

void KvStatsRegistry::RecordTransfer(const std::string& slot, TransferDirection direction, PageKind kind, int64_t bytes,
                                     double seconds) {
  constexpr size_t kBuckets = std::size(kTransferBuckets);
  absl::MutexLock lock(&mu_);
  TransferSample& t = transfers_[TransferKey(slot, direction, kind)];
  if (t.le.empty()) {
    t.slot = slot;
    t.direction = direction;
    t.kind = kind;
    t.le.assign(kBuckets, 0);
  }
  t.bytes += bytes;
  t.count += 1;
  t.seconds_sum += seconds;
  for (size_t i = 0; i < kBuckets; ++i) {
    if (seconds <= kTransferBuckets[i]) t.le[i] += 1;
  }
}

std::vector<PoolSample> KvStatsRegistry::Pools() const {
  absl::MutexLock lock(&mu_);
  pools_.erase(std::remove_if(pools_.begin(), pools_.end(), [](const PoolEntry& e) { return e.counters.expired(); }),
               pools_.end());
  std::vector<PoolSample> out;
  for (const PoolEntry& e : pools_) {
    const std::shared_ptr<PoolCounters> c = e.counters.lock();
    if (c == nullptr) continue;
    out.push_back(PoolSample{.slot = e.slot,
                             .tier = e.tier,
                             .kind = e.kind,
                             .capacity_pages = c->capacity_pages(),
                             .used_pages = c->used_pages(),
                             .peak_pages = c->peak_pages(),
                             .bytes_per_page = c->bytes_per_page()});
  }
  return out;
}

std::vector<TransferSample> KvStatsRegistry::Transfers() const {
  absl::MutexLock lock(&mu_);
  std::vector<TransferSample> out;
  for (const auto& [key, t] : transfers_) out.push_back(t);
  return out;
}

}  // namespace oomb
