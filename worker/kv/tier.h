// Where a KV page lives and what it holds: the two enums every part of the KV memory system
// shares (page pools, caches, the copy engine, the metrics registry). Torch-free, so the daemon
// and worker/metrics can name tiers and kinds without LibTorch.
#ifndef OOMB_WORKER_KV_TIER_H_
#define OOMB_WORKER_KV_TIER_H_

#include <cstdint>

namespace oomb {

enum class Tier : uint8_t { kDevice = 0, kHost = 1 };
enum class PageKind : uint8_t { kKv = 0, kKvGrad = 1 };

// Metric label values and message words: "gpu" | "host", "kv" | "kv_grad".
inline const char* TierName(Tier t) { return t == Tier::kHost ? "host" : "gpu"; }
inline const char* KindName(PageKind k) { return k == PageKind::kKvGrad ? "kv_grad" : "kv"; }

// Pinned host memory the copy engine stages additions into host pages through (CUDA, when
// pages live on the host): kHostAddStagingBuffers buffers of kHostAddStagingBytes each.
inline constexpr int64_t kHostAddStagingBytes = int64_t{64} << 20;
inline constexpr int kHostAddStagingBuffers = 16;

}  // namespace oomb

#endif  // OOMB_WORKER_KV_TIER_H_
