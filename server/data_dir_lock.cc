#include "server/data_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace oomb::server {

absl::StatusOr<DataDirLock> DataDirLock::Acquire(const std::string& data_dir) {
  const std::string path = data_dir + "/oombd.lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return ErrnoStatus(errno, "open", path);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return ErrnoStatus(errno, "lock", path);
    char pid[32] = {};
    const ssize_t n = ::pread(fd.get(), pid, sizeof pid - 1, 0);
    return absl::FailedPreconditionError(
        absl::StrCat("another oombd (pid ", n > 0 ? absl::StripAsciiWhitespace(pid) : "unknown",
                     ") is serving the data dir ", data_dir, "; stop it first, or give this one another data dir"));
  }
  const std::string me = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), me.data(), me.size(), 0) < 0) {
    return ErrnoStatus(errno, "write", path);
  }
  return DataDirLock(std::move(fd));
}

}  // namespace oomb::server
