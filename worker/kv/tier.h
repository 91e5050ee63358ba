// Where a KV page lives and what it holds: the two enums every part of the KV memory system
// shares (page pools, caches, the copy engine, the metrics registry), and the pools' sizes a
// memory plan places. Torch-free, so the daemon, the planner and worker/metrics can name them
// without LibTorch.
#ifndef OOMB_WORKER_KV_TIER_H_
#define OOMB_WORKER_KV_TIER_H_

#include <cstdint>

namespace oomb {

enum class Tier : uint8_t { kDevice = 0, kHost = 1 };
enum class PageKind : uint8_t { kKv = 0, kKvGrad = 1 };

// Metric label values and message words: "gpu" | "host", "kv" | "kv_grad".
inline const char* TierName(Tier t) { return t == Tier::kHost ? "host" : "gpu"; }
inline const char* KindName(PageKind k) { return k == PageKind::kKvGrad ? "kv_grad" : "kv"; }

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

#endif  // OOMB_WORKER_KV_TIER_H_
