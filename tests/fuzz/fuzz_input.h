// Fuzz input plumbing: the readers under test take an open file (worker/common/file_access.h),
// so each input is written to an anonymous in-memory file (memfd; no disk I/O).
#ifndef OOMB_TESTS_FUZZ_FUZZ_INPUT_H_
#define OOMB_TESTS_FUZZ_FUZZ_INPUT_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "worker/common/file_access.h"

namespace oomb::fuzz {

// An in-memory file holding `size` bytes of `data`.
inline File MemFile(const uint8_t* data, size_t size) {
  UniqueFd fd(::memfd_create("oomb_fuzz", MFD_CLOEXEC));
  if (!fd.valid()) std::abort();
  for (size_t off = 0; off < size;) {
    const ssize_t n = ::write(fd.get(), data + off, size - off);
    if (n <= 0) std::abort();
    off += static_cast<size_t>(n);
  }
  return File(std::move(fd), "fuzz-input", static_cast<int64_t>(size));
}

}  // namespace oomb::fuzz

#endif  // OOMB_TESTS_FUZZ_FUZZ_INPUT_H_
