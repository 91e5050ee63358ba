#include "kernels/torch/page_ops.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "kernels/page_copy.h"
#include "kernels/reference/page_copy_ref.h"

#if defined(OOMB_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace oomb::kernels {
namespace {

PageCopyParams MakeParams(const at::Tensor& arena, const at::Tensor& slots, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(arena.dim() == 5 && arena.size(1) == 2,
              "arena: expected [num_slots, 2, kv_heads, page_tokens, head_dim], got ", arena.sizes());
  TORCH_CHECK(arena.is_contiguous(), "arena: must be contiguous");
  TORCH_CHECK(slots.dim() == 1 && slots.scalar_type() == at::kInt, "slots: expected 1-D int32, got ", slots.sizes(),
              " ", slots.scalar_type());
  TORCH_CHECK(slots.device() == arena.device(), "slots: on ", slots.device(), ", arena on ", arena.device());
  const int64_t n = slots.size(0), h = arena.size(2), pt = arena.size(3), d = arena.size(4);
  for (const auto* t : {&k, &v}) {
    TORCH_CHECK(t->sizes() == at::IntArrayRef({h, n * pt, d}), "k/v: expected [", h, ", ", n * pt, ", ", d, "], got ",
                t->sizes());
    TORCH_CHECK(t->scalar_type() == arena.scalar_type(), "k/v: dtype ", t->scalar_type(), ", arena ",
                arena.scalar_type());
    TORCH_CHECK(t->device() == arena.device(), "k/v: on ", t->device(), ", arena on ", arena.device());
    TORCH_CHECK(t->is_contiguous(), "k/v: must be contiguous");
  }
  PageCopyParams p;
  p.arena = arena.data_ptr();
  p.slots = slots.data_ptr<int32_t>();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.num_pages = n;
  p.kv_heads = h;
  p.page_tokens = pt;
  p.head_dim = d;
  p.elem_bytes = static_cast<int64_t>(arena.element_size());
  if (arena.is_cpu() && n > 0) {
    auto s = slots.contiguous();
    const int32_t* sp = s.data_ptr<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
      TORCH_CHECK(sp[i] >= 0 && sp[i] < arena.size(0), "slots[", i, "] = ", sp[i], " out of [0, ", arena.size(0), ")");
    }
  }
  return p;
}

template <typename CpuFn, typename CudaFn>
void Run(const at::Tensor& arena, const PageCopyParams& p, CpuFn cpu, CudaFn cuda) {
  if (arena.is_cpu()) {
    cpu(p);
    return;
  }
#if defined(OOMB_HAVE_CUDA)
  TORCH_CHECK(arena.is_cuda(), "arena: unsupported device ", arena.device());
  const c10::cuda::CUDAGuard guard(arena.device());
  const cudaError_t err = cuda(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "page copy kernel: ", cudaGetErrorString(err));
#else
  TORCH_CHECK(false, "arena on ", arena.device(), " but oomb was built without CUDA");
#endif
}

}  // namespace

std::pair<at::Tensor, at::Tensor> GatherPages(const at::Tensor& arena, const at::Tensor& slots) {
  const int64_t n = slots.size(0);
  auto k = at::empty({arena.size(2), n * arena.size(3), arena.size(4)}, arena.options());
  auto v = at::empty_like(k);
  const PageCopyParams p = MakeParams(arena, slots, k, v);
  Run(arena, p, reference::PageGather, LaunchPageGather);
  return {k, v};
}

void ScatterPages(at::Tensor& arena, const at::Tensor& slots, const at::Tensor& k, const at::Tensor& v) {
  const PageCopyParams p = MakeParams(arena, slots, k, v);
  Run(arena, p, reference::PageScatter, LaunchPageScatter);
}

void ScatterAddPages(at::Tensor& arena, const at::Tensor& slots, const at::Tensor& k, const at::Tensor& v) {
  const PageCopyParams p = MakeParams(arena, slots, k, v);
  TORCH_CHECK(arena.scalar_type() == at::kFloat || (arena.is_cpu() && arena.scalar_type() == at::kDouble),
              "ScatterAddPages: arena must be float32 (or float64 on the CPU), got ", arena.scalar_type(), " on ",
              arena.device());
  Run(arena, p, reference::PageScatterAdd, LaunchPageScatterAddF32);
}

}  // namespace oomb::kernels
