// The page pools of one job on one device, as the memory planner placed them
// (worker/plan/memory_planner.h): KV and KV-gradient pools on the device and, when the plan puts
// pages on the host, host pools (pinned on a GPU, in slabs); and the copy engine that moves
// their pages and the attention results the trainer swaps to the host. The executor, the
// benchmark and the tests make their pools here.
#ifndef OOMB_WORKER_KV_KV_POOLS_H_
#define OOMB_WORKER_KV_KV_POOLS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/kv/copy_engine.h"
#include "worker/kv/page_pool.h"

namespace oomb {

// The pools a sequence's pages come from. The host pools are optional; `copies` moves their
// pages (required with them) and the trainer's swapped attention results.
struct KvPools {
  PagePool* kv = nullptr;
  PagePool* grad = nullptr;
  PagePool* kv_host = nullptr;
  PagePool* grad_host = nullptr;
  CopyEngine* copies = nullptr;
};

struct OwnedKvPools {
  std::unique_ptr<PagePool> kv, grad;            // device tier
  std::unique_ptr<PagePool> kv_host, grad_host;  // host tier; null when nothing is placed there
  std::unique_ptr<CopyEngine> copies;

  // The pools, for a KvStore or a ChunkTrainer.
  KvPools pools() const { return {kv.get(), grad.get(), kv_host.get(), grad_host.get(), copies.get()}; }
  // Every pool there is (device first).
  std::vector<PagePool*> all() const;
};

// The KV-gradient pages' dtype under a model of `model_dtype`: bfloat16 pages (accumulated in
// float32, stored rounded) when `bfloat16_pages` (memory.kv_grad_dtype) and the model is
// bfloat16; float32 otherwise (float64 under a float64 model: the exactness tests).
at::ScalarType GradPageDtype(bool bfloat16_pages, at::ScalarType model_dtype);

// The pools of `sizes`, on `device` and the host (slabs of `host_slab_bytes`, pinned when
// `device` is a GPU; their threads start pinning now). RESOURCE_EXHAUSTED when a device arena
// cannot be allocated.
absl::StatusOr<OwnedKvPools> MakeKvPools(PageShape shape, at::ScalarType kv_dtype, at::ScalarType grad_dtype,
                                         at::Device device, KvPoolSizes sizes,
                                         int64_t host_slab_bytes = int64_t{1} << 30);

}  // namespace oomb

#endif  // OOMB_WORKER_KV_KV_POOLS_H_
