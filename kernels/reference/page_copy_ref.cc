#include "kernels/reference/page_copy_ref.h"

#include <cstring>

namespace oomb::kernels::reference {
namespace {

// Calls fn(arena_run, buffer_run, run_elems) for every contiguous (page, k|v, head) run.
template <typename Fn>
void ForEachRun(const PageCopyParams& p, Fn fn) {
  const int64_t run_elems = p.page_tokens * p.head_dim;
  char* arena = static_cast<char*>(p.arena);
  for (int64_t page = 0; page < p.num_pages; ++page) {
    const int64_t slot = p.slots[page];
    for (int64_t kv = 0; kv < 2; ++kv) {
      char* buf = static_cast<char*>(kv == 0 ? p.k : p.v);
      for (int64_t head = 0; head < p.kv_heads; ++head) {
        const int64_t a = ((slot * 2 + kv) * p.kv_heads + head) * run_elems;
        const int64_t b = (head * p.num_pages + page) * run_elems;
        fn(arena + a * p.elem_bytes, buf + b * p.elem_bytes, run_elems);
      }
    }
  }
}

}  // namespace

void PageGather(const PageCopyParams& p) {
  ForEachRun(p, [&](char* arena, char* buf, int64_t n) { std::memcpy(buf, arena, n * p.elem_bytes); });
}

void PageScatter(const PageCopyParams& p) {
  ForEachRun(p, [&](char* arena, char* buf, int64_t n) { std::memcpy(arena, buf, n * p.elem_bytes); });
}

template <typename T>
void AddRuns(const PageCopyParams& p) {
  ForEachRun(p, [](char* arena, char* buf, int64_t n) {
    T* a = reinterpret_cast<T*>(arena);
    const T* b = reinterpret_cast<const T*>(buf);
    for (int64_t i = 0; i < n; ++i) a[i] += b[i];
  });
}

void PageScatterAdd(const PageCopyParams& p) {
  if (p.elem_bytes == 8) {
    AddRuns<double>(p);
  } else {
    AddRuns<float>(p);
  }
}

}  // namespace oomb::kernels::reference
