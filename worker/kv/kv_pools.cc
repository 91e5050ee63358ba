#include "worker/kv/kv_pools.h"

#include <ATen/ATen.h>

#include "worker/common/status.h"

namespace oomb {

std::vector<PagePool*> OwnedKvPools::all() const {
  std::vector<PagePool*> out;
  for (PagePool* p : {kv.get(), grad.get(), kv_host.get(), grad_host.get()}) {
    if (p != nullptr) out.push_back(p);
  }
  return out;
}

at::ScalarType GradPageDtype(bool bfloat16_pages, at::ScalarType model_dtype) {
  if (model_dtype == at::kDouble) return at::kDouble;
  return bfloat16_pages && model_dtype == at::kBFloat16 ? at::kBFloat16 : at::kFloat;
}

absl::StatusOr<OwnedKvPools> MakeKvPools(PageShape shape, at::ScalarType kv_dtype, at::ScalarType grad_dtype,
                                         at::Device device, KvPoolSizes sizes, int64_t host_slab_bytes) {
  OwnedKvPools p;
  const auto on_device = at::TensorOptions().device(device);
  OOMB_ASSIGN_OR_RETURN(
      p.kv, PagePool::Create(PageKind::kKv, Tier::kDevice, shape, on_device.dtype(kv_dtype), sizes.device_kv));
  OOMB_ASSIGN_OR_RETURN(p.grad, PagePool::Create(PageKind::kKvGrad, Tier::kDevice, shape, on_device.dtype(grad_dtype),
                                                 sizes.device_grad));
  const bool pinned = device.is_cuda();
  if (sizes.host_kv > 0) {
    p.kv_host = PagePool::CreateHost(PageKind::kKv, shape, kv_dtype, sizes.host_kv, pinned, host_slab_bytes);
  }
  if (sizes.host_grad > 0) {
    p.grad_host = PagePool::CreateHost(PageKind::kKvGrad, shape, grad_dtype, sizes.host_grad, pinned, host_slab_bytes);
  }
  p.copies = std::make_unique<CopyEngine>(device);
  return p;
}

}  // namespace oomb
