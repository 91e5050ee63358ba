// libFuzzer target: the safetensors reader (worker/hf/safetensors.h) on arbitrary bytes.
// Contract checked: no crash, leak or UB; an accepted file's tensor views lie inside the
// mapping, have the size their dtype and shape say, and do not overlap (every byte of every
// view is read, so ASan sees any out-of-bounds view).
#include <cstdint>
#include <cstdlib>

#include "tests/fuzz/fuzz_input.h"
#include "worker/hf/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const oomb::File file = oomb::fuzz::MemFile(data, size);
  auto f = oomb::SafetensorsFile::Open(file);
  if (!f.ok()) return 0;
  const uint8_t* prev_end = nullptr;
  volatile uint8_t sink = 0;
  for (const oomb::TensorView& t : (*f)->tensors()) {
    const int64_t n = oomb::NumElements(t.shape);
    if (n < 0 || static_cast<size_t>(n) * oomb::DTypeSize(t.dtype) != t.nbytes) std::abort();
    const auto* p = static_cast<const uint8_t*>(t.data);
    if (t.nbytes > 0 && prev_end != nullptr && p < prev_end) std::abort();  // sorted, no overlap
    for (size_t i = 0; i < t.nbytes; ++i) sink = sink ^ p[i];
    if (t.nbytes > 0) prev_end = p + t.nbytes;
    if ((*f)->Find(t.name) != &t) std::abort();
  }
  (void)sink;
  return 0;
}
