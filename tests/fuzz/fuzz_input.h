// Fuzz input plumbing: the readers under test take a path, so each input is written to an
// anonymous in-memory file (memfd) and read back through /proc/self/fd (no disk I/O).
#ifndef OOMB_TESTS_FUZZ_FUZZ_INPUT_H_
#define OOMB_TESTS_FUZZ_FUZZ_INPUT_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace oomb::fuzz {

// An in-memory file holding `size` bytes of `data`, closed on destruction.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) : fd_(::memfd_create("oomb_fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) std::abort();
    for (size_t off = 0; off < size;) {
      const ssize_t n = ::write(fd_, data + off, size - off);
      if (n <= 0) std::abort();
      off += static_cast<size_t>(n);
    }
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

}  // namespace oomb::fuzz

#endif  // OOMB_TESTS_FUZZ_FUZZ_INPUT_H_
