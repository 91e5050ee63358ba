#include "kernels/torch/page_ops.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <vector>

#include "kernels/page_copy.h"
#include "kernels/reference/page_copy_ref.h"
#include "kernels/selected_pages.h"

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

// ---- Selected pages ---------------------------------------------------------------------

struct Selected {
  int64_t n_tiles, kv_heads, n, page_tokens, head_dim;
  std::vector<int64_t> Shape() const { return {n_tiles, kv_heads, n * page_tokens, head_dim}; }
};

Selected CheckSelected(const at::Tensor& arena, const at::Tensor& slots, const at::Tensor& selection) {
  TORCH_CHECK(arena.dim() == 5 && arena.size(1) == 2 && arena.is_contiguous(),
              "arena: expected contiguous [num_slots, 2, kv_heads, page_tokens, head_dim], got ", arena.sizes());
  TORCH_CHECK(slots.dim() == 1 && slots.scalar_type() == at::kInt && slots.device() == arena.device(),
              "slots: expected 1-D int32 on ", arena.device(), ", got ", slots.sizes(), " ", slots.scalar_type(),
              " on ", slots.device());
  TORCH_CHECK(selection.dim() == 3 && selection.size(1) == arena.size(2) && selection.scalar_type() == at::kLong &&
                  selection.device() == arena.device(),
              "selection: expected int64 [n_tiles, ", arena.size(2), ", n] on ", arena.device(), ", got ",
              selection.scalar_type(), " ", selection.sizes(), " on ", selection.device());
  return {selection.size(0), arena.size(2), selection.size(2), arena.size(3), arena.size(4)};
}

// Checks `second` (defined) against the arena, and that the slots are one per selection entry.
void CheckSecond(const at::Tensor& arena, const at::Tensor& slots, const at::Tensor& selection,
                 const at::Tensor& second) {
  TORCH_CHECK(slots.sizes() == selection.sizes() && slots.is_contiguous(), "slots: with `second`, expected ",
              "contiguous ", selection.sizes(), " (a slot per selection entry), got ", slots.sizes());
  TORCH_CHECK(arena.dim() == 5 && second.dim() == 4 && second.size(1) == 2 && second.size(2) == arena.size(3) &&
                  second.size(3) == arena.size(4) && second.scalar_type() == arena.scalar_type() &&
                  second.device() == arena.device() && second.is_contiguous(),
              "second: expected contiguous [m, 2, page_tokens, head_dim] of the arena's dtype and device, got ",
              second.sizes(), " of ", second.scalar_type(), " on ", second.device());
}

// The row holding each selection entry's page and head, K or V (`values`), flattened: of the
// arena's rows [num_slots * 2 * kv_heads, page_tokens, head_dim], followed (`per_entry`: the
// slots are a slot per entry, `second` given) by second's [m * 2, page_tokens, head_dim]; -1
// entries: row 0, for the caller to mask or drop.
at::Tensor EntryRows(int64_t num_slots, const at::Tensor& slots, const at::Tensor& selection, bool per_entry,
                     bool values) {
  const int64_t kv_heads = selection.size(1), kv = values ? 1 : 0;
  const at::Tensor slot =
      per_entry ? slots.to(at::kLong).view(selection.sizes())
                : slots.to(at::kLong).index_select(0, selection.clamp_min(0).flatten()).view(selection.sizes());
  const at::Tensor row = (slot * 2 + kv) * kv_heads + at::arange(kv_heads, selection.options()).view({1, -1, 1});
  if (!per_entry) return row.masked_fill(selection < 0, 0).flatten();
  const at::Tensor second_row = num_slots * 2 * kv_heads + (-slot - 1) * 2 + kv;
  return at::where(slot >= 0, row, second_row).masked_fill(selection < 0, 0).flatten();
}

#if defined(OOMB_HAVE_CUDA)
// The accumulation kernel's sort keys, flattened: entries adding into one run share a key, and
// -1 entries all get one past every run's (few ops: each is a launch on the training thread).
// Per page: h * num_pages + page; per entry (`second` given): slot * kv_heads + h for an arena
// run, num_slots * kv_heads + i for image i of `second`.
at::Tensor RunKeys(const at::Tensor& arena, const at::Tensor& slots, const at::Tensor& selection,
                   const at::Tensor& second) {
  const int64_t kv_heads = selection.size(1);
  const at::Tensor head = at::arange(kv_heads, selection.options()).view({1, -1, 1});
  if (!second.defined()) {
    const int64_t num_pages = slots.size(0);
    return at::where(selection >= 0, head * num_pages + selection, num_pages * kv_heads).flatten();
  }
  const int64_t images = arena.size(0) * kv_heads;  // the first image's key
  const at::Tensor slot = slots.view(selection.sizes()).to(at::kLong);
  const at::Tensor key = at::where(slot >= 0, slot * kv_heads + head, (images - 1) - slot);
  return at::where(selection >= 0, key, images + second.size(0)).flatten();
}
#endif

// Whether the CUDA kernels take these tensors (else the reference runs, on their device).
bool KernelTakes(const at::Tensor& arena, const at::Tensor& buffer) {
  const auto takes = [](const at::Tensor& t) {
    return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kFloat;
  };
  return arena.is_cuda() && takes(arena) && takes(buffer);
}

#if defined(OOMB_HAVE_CUDA)
PageDtype ToPageDtype(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat ? PageDtype::kFloat32 : PageDtype::kBFloat16;
}

SelectedPagesParams MakeSelectedParams(const at::Tensor& arena, const at::Tensor& slots, const at::Tensor& selection,
                                       const at::Tensor& k, const at::Tensor& v, const Selected& s) {
  for (const at::Tensor* t : {&k, &v}) {
    TORCH_CHECK(t->is_contiguous() && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0,
                "k/v: must be contiguous and 16-byte aligned");
  }
  SelectedPagesParams p;
  p.arena = arena.data_ptr();
  p.slots = slots.data_ptr<int32_t>();
  p.selection = selection.data_ptr<int64_t>();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.entries = selection.numel();
  p.n = s.n;
  p.num_pages = slots.size(0);
  p.kv_heads = s.kv_heads;
  p.page_tokens = s.page_tokens;
  p.head_dim = s.head_dim;
  p.arena_dtype = ToPageDtype(arena);
  p.buffer_dtype = ToPageDtype(k);
  return p;
}

void Launch(const at::Tensor& arena, cudaError_t (*launch)(const SelectedPagesParams&, cudaStream_t),
            const SelectedPagesParams& p) {
  const c10::cuda::CUDAGuard guard(arena.device());
  const cudaError_t err = launch(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "selected pages kernel: ", cudaGetErrorString(err));
}
#endif

}  // namespace

std::pair<at::Tensor, at::Tensor> GatherSelectedPages(const at::Tensor& arena, const at::Tensor& slots,
                                                      const at::Tensor& selection, const at::Tensor& second) {
  if (second.defined()) CheckSecond(arena, slots, selection, second);
  const Selected s = CheckSelected(arena, second.defined() ? slots.flatten() : slots, selection);
  if (s.n == 0 || s.n_tiles == 0 || (arena.size(0) == 0 && !second.defined())) {  // nothing to read
    const at::Tensor none = at::zeros(s.Shape(), arena.options());
    return {none, none.clone()};
  }
#if defined(OOMB_HAVE_CUDA)
  if (KernelTakes(arena, arena)) {
    at::Tensor k = at::empty(s.Shape(), arena.options()), v = at::empty_like(k);
    const at::Tensor sel = selection.contiguous();
    SelectedPagesParams p = MakeSelectedParams(arena, slots, sel, k, v, s);
    if (second.defined()) p.second = second.data_ptr();
    Launch(arena, LaunchGatherSelectedPages, p);
    return {k, v};
  }
#endif
  // The reference: each entry's row of the arena's and the second's, zeros for -1.
  const at::Tensor arena_rows = arena.view({arena.size(0) * 2 * s.kv_heads, s.page_tokens, s.head_dim});
  const at::Tensor rows = second.defined()
                              ? at::cat({arena_rows, second.view({second.size(0) * 2, s.page_tokens, s.head_dim})})
                              : arena_rows;
  const at::Tensor none = (selection < 0).view({s.n_tiles, s.kv_heads, s.n, 1, 1});
  const auto take = [&](bool values) {
    return rows.index_select(0, EntryRows(arena.size(0), slots, selection, second.defined(), values))
        .view({s.n_tiles, s.kv_heads, s.n, s.page_tokens, s.head_dim})
        .masked_fill_(none, 0)
        .view(s.Shape());
  };
  return {take(false), take(true)};
}

void AccumulateSelectedPages(at::Tensor& arena, const at::Tensor& slots, const at::Tensor& selection,
                             const at::Tensor& k, const at::Tensor& v, const at::Tensor& second) {
  if (second.defined()) CheckSecond(arena, slots, selection, second);
  const Selected s = CheckSelected(arena, second.defined() ? slots.flatten() : slots, selection);
  for (const at::Tensor* t : {&k, &v}) {
    TORCH_CHECK(t->sizes() == at::IntArrayRef(s.Shape()) && t->device() == arena.device(), "k/v: expected ",
                at::IntArrayRef(s.Shape()), " on ", arena.device(), ", got ", t->sizes(), " on ", t->device());
  }
  if (selection.numel() == 0) return;
#if defined(OOMB_HAVE_CUDA)
  if (KernelTakes(arena, k) && v.scalar_type() == k.scalar_type()) {
    // Entries sorted by the run they add into; -1 entries sort last.
    const at::Tensor key = RunKeys(arena, slots, selection, second);
    auto [sorted_key, order] = at::sort(key, /*stable=*/true, /*dim=*/0, /*descending=*/false);
    const at::Tensor kc = k.contiguous(), vc = v.contiguous();
    SelectedPagesParams p = MakeSelectedParams(arena, slots, selection.contiguous(), kc, vc, s);
    p.order = order.data_ptr<int64_t>();
    p.sorted_key = sorted_key.data_ptr<int64_t>();
    if (second.defined()) p.second = second.data_ptr();
    Launch(arena, LaunchAccumulateSelectedPages, p);
    return;
  }
#endif
  // As the kernel: each run's contributions summed first, then added to the run once (so adding
  // into a zeroed image and that image into the page later gives the same page); a run of
  // `second` set to its sum.
  const at::ScalarType acc = arena.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor keep = (selection >= 0).flatten().nonzero().squeeze(1);
  const int64_t arena_rows = arena.size(0) * 2 * s.kv_heads;  // then the second's
  at::Tensor rows = arena.view({arena_rows, s.page_tokens, s.head_dim});
  for (const bool values : {false, true}) {
    const at::Tensor& d = values ? v : k;
    const auto [runs, inverse, counts] =
        at::_unique2(EntryRows(arena.size(0), slots, selection, second.defined(), values).index_select(0, keep),
                     /*sorted=*/true, /*return_inverse=*/true, /*return_counts=*/false);
    at::Tensor sums = at::zeros({runs.size(0), s.page_tokens, s.head_dim}, d.options().dtype(acc));
    sums.index_add_(0, inverse, d.reshape({-1, s.page_tokens, s.head_dim}).index_select(0, keep).to(acc));
    const at::Tensor in_arena = runs < arena_rows;
    const at::Tensor a = in_arena.nonzero().squeeze(1), b = in_arena.logical_not().nonzero().squeeze(1);
    const at::Tensor to_arena = runs.index_select(0, a);
    rows.index_copy_(0, to_arena,
                     (rows.index_select(0, to_arena).to(acc) + sums.index_select(0, a)).to(arena.scalar_type()));
    if (b.numel() > 0) {
      second.view({second.size(0) * 2, s.page_tokens, s.head_dim})
          .index_copy_(0, runs.index_select(0, b) - arena_rows, sums.index_select(0, b).to(arena.scalar_type()));
    }
  }
}

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
