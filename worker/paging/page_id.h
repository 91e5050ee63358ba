// The vocabulary of paged KV memory, torch-free: where a page lives (Tier), what it holds
// (PageKind), the id that says both where and which slot (PageId), a page's shape, and the
// pools' sizes a memory plan places. Shared by the page table (page_table.h), the planner
// (worker/plan), the metrics registry (worker/metrics) and the pools and copies (worker/kv).
//
// A page holds `page_tokens` tokens of one layer: K and V of every KV head,
// [2, kv_heads, page_tokens, head_dim].
#ifndef OOMB_WORKER_PAGING_PAGE_ID_H_
#define OOMB_WORKER_PAGING_PAGE_ID_H_

#include <cstdint>

namespace oomb {

enum class Tier : uint8_t { kDevice = 0, kHost = 1 };
// What the copy engine moves: KV pages, KV-gradient pages, or (no page pool of its own) the
// attention results stage 1 swaps to the host for stage 2 (worker/train/attention_swap.h).
enum class PageKind : uint8_t { kKv = 0, kKvGrad = 1, kSwap = 2 };

// Metric label values and message words: "gpu" | "host", "kv" | "kv_grad" | "swap".
inline const char* TierName(Tier t) { return t == Tier::kHost ? "host" : "gpu"; }
inline const char* KindName(PageKind k) {
  return k == PageKind::kKvGrad ? "kv_grad" : k == PageKind::kSwap ? "swap" : "kv";
}

// A page's tier in the top bit and its slot in that tier's arena below (docs/CONVENTIONS.md §6.7).
class PageId {
 public:
  static constexpr uint32_t kHostBit = uint32_t{1} << 31;
  static constexpr uint32_t kInvalid = ~uint32_t{0};

  PageId() = default;
  PageId(Tier tier, uint32_t slot) : raw_(slot | (tier == Tier::kHost ? kHostBit : 0)) {}

  bool valid() const { return raw_ != kInvalid; }
  Tier tier() const { return (raw_ & kHostBit) ? Tier::kHost : Tier::kDevice; }
  uint32_t slot() const { return raw_ & ~kHostBit; }
  uint32_t raw() const { return raw_; }
  bool operator==(const PageId& o) const { return raw_ == o.raw_; }

 private:
  uint32_t raw_ = kInvalid;
};

struct PageShape {
  int64_t kv_heads = 0;
  int64_t page_tokens = 0;
  int64_t head_dim = 0;
  int64_t elems() const { return 2 * kv_heads * page_tokens * head_dim; }
};

// How many pages each pool of a job holds (worker/kv/kv_pools.h, MakeKvPools).
struct KvPoolSizes {
  int64_t device_kv = 0, device_grad = 0;
  int64_t host_kv = 0, host_grad = 0;  // a host pool is made only for a count above 0
  // `device` KV and as many gradient pages on the device, `host` of each on the host.
  static KvPoolSizes Pairs(int64_t device, int64_t host) { return {device, device, host, host}; }
};

// Bytes of additions into host pages the copy engine keeps queued (CUDA, when pages live on the
// host; worker/kv/copy_engine.h): the device holds each one's contributions until added.
inline constexpr int64_t kHostAddBytesInFlight = int64_t{512} << 20;

}  // namespace oomb

#endif  // OOMB_WORKER_PAGING_PAGE_ID_H_
