#include "server/watched_file.h"

#include <sys/stat.h>

#include <cerrno>

#include "worker/common/file_access.h"
#include "worker/common/status.h"

namespace oomb::server {

absl::StatusOr<std::optional<std::string>> WatchedFile::ReadIfChanged() {
  const time_t now = std::time(nullptr);
  if (read_ && now == checked_) return std::nullopt;
  checked_ = now;
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", path_);
  if (read_ && st.st_ino == inode_ && st.st_size == size_ && st.st_mtim.tv_sec == mtime_.tv_sec &&
      st.st_mtim.tv_nsec == mtime_.tv_nsec) {
    return std::nullopt;
  }
  OOMB_ASSIGN_OR_RETURN(std::string text, FileAccess::Unconfined()->ReadFile(path_, int64_t{64} << 20));
  read_ = true;
  inode_ = st.st_ino;
  size_ = st.st_size;
  mtime_ = st.st_mtim;
  return text;
}

}  // namespace oomb::server
