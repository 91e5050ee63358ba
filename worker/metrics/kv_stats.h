// Live accounting of the KV memory system of this process, for /metrics: the page pools of the
// jobs running now and the copy engine's transfers between tiers. Training threads write it;
// the daemon's metrics collector reads it at scrape time. Torch-free.
//
// Pools: the executor registers each PagePool it creates (AddPool) and attaches the returned
// PoolCounters to it; the pool stores its used and peak page counts there on every allocation
// and free (two relaxed atomic stores). The registry holds the counters weakly: a pool's entry
// disappears when the pool and its counters are gone (the job ended).
//
// Transfers: RecordTransfer() adds one batch of page copies between tiers (bytes and duration)
// to cumulative counters and a duration histogram by slot, direction and page kind. The copy
// engine (worker/kv/copy_engine.h) calls it through its observer, which the executor sets; on a
// GPU the durations come from CUDA events and are reported at the next fence (once per chunk).
//
// Thread-safety: every method may be called from any thread.
#ifndef OOMB_WORKER_METRICS_KV_STATS_H_
#define OOMB_WORKER_METRICS_KV_STATS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/paging/page_id.h"

namespace oomb {

enum class TransferDirection : uint8_t { kHostToDevice = 0, kDeviceToHost = 1 };
const char* DirectionName(TransferDirection d);  // "h2d" | "d2h" (metric label values)

// One pool's live page counts. Written by the pool's owner thread, read by any thread.
class PoolCounters {
 public:
  PoolCounters(int64_t capacity_pages, int64_t bytes_per_page)
      : capacity_pages_(capacity_pages), bytes_per_page_(bytes_per_page) {}
  PoolCounters(const PoolCounters&) = delete;
  PoolCounters& operator=(const PoolCounters&) = delete;

  // `peak_pages`: the most pages in use at once since the pool's peak was last reset (the
  // trainer resets it at the start of every sequence).
  void Set(int64_t used_pages, int64_t peak_pages) {
    used_pages_.store(used_pages, std::memory_order_relaxed);
    peak_pages_.store(peak_pages, std::memory_order_relaxed);
  }
  int64_t capacity_pages() const { return capacity_pages_; }
  int64_t bytes_per_page() const { return bytes_per_page_; }
  int64_t used_pages() const { return used_pages_.load(std::memory_order_relaxed); }
  int64_t peak_pages() const { return peak_pages_.load(std::memory_order_relaxed); }

 private:
  const int64_t capacity_pages_;
  const int64_t bytes_per_page_;
  std::atomic<int64_t> used_pages_{0};
  std::atomic<int64_t> peak_pages_{0};
};

// A pool as seen at one moment. Fields are read one by one, so `used_pages` and
// `peak_pages` may straddle an allocation; each is a value the pool really had.
struct PoolSample {
  std::string slot;  // the scheduler device the pool's job runs on: "cpu", "cuda:0"
  Tier tier = Tier::kDevice;
  PageKind kind = PageKind::kKv;
  int64_t capacity_pages = 0;
  int64_t used_pages = 0;
  int64_t peak_pages = 0;
  int64_t bytes_per_page = 0;
};

// Cumulative transfers of one (slot, direction, kind).
struct TransferSample {
  std::string slot;
  TransferDirection direction = TransferDirection::kHostToDevice;
  PageKind kind = PageKind::kKv;
  int64_t bytes = 0;
  int64_t count = 0;        // transfers recorded
  double seconds_sum = 0;   // their durations added up
  std::vector<int64_t> le;  // cumulative counts: le[i] = transfers taking <= kTransferBuckets[i]
};

class KvStatsRegistry {
 public:
  // Upper bounds (seconds) of the transfer-duration histogram: one 64 KiB page over a PCIe
  // Gen5 x16 link takes ~1.2 us; a batched copy of a layer's pages at 128K tokens, ~10 ms.
  static constexpr double kTransferBuckets[] = {1e-6, 5e-6, 2e-5, 1e-4, 5e-4, 1e-3, 5e-3, 2e-2, 0.1, 0.5, 2.0};

  KvStatsRegistry() = default;
  KvStatsRegistry(const KvStatsRegistry&) = delete;
  KvStatsRegistry& operator=(const KvStatsRegistry&) = delete;

  // Registers a pool; its entry lasts as long as the returned counters (held by the pool).
  std::shared_ptr<PoolCounters> AddPool(const std::string& slot, Tier tier, PageKind kind, int64_t capacity_pages,
                                        int64_t bytes_per_page);

  // One copy of `bytes` between the tiers of `slot` that took `seconds`.
  void RecordTransfer(const std::string& slot, TransferDirection direction, PageKind kind, int64_t bytes,
                      double seconds);

  // The pools alive now (several pools of one slot, tier and kind are listed separately).
  std::vector<PoolSample> Pools() const;
  // Every (slot, direction, kind) that has recorded a transfer.
  std::vector<TransferSample> Transfers() const;

 private:
  struct PoolEntry {
    std::string slot;
    Tier tier;
    PageKind kind;
    std::weak_ptr<PoolCounters> counters;
  };
  using TransferKey = std::tuple<std::string, TransferDirection, PageKind>;

  mutable absl::Mutex mu_;
  mutable std::vector<PoolEntry> pools_ ABSL_GUARDED_BY(mu_);  // expired entries are pruned when read
  std::map<TransferKey, TransferSample> transfers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace oomb

#endif  // OOMB_WORKER_METRICS_KV_STATS_H_
