#include "worker/common/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace oomb {

absl::Status ErrnoStatus(int err, const char* what, const std::string& path) {
  const std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno, "cannot open", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return ErrnoStatus(errno, "cannot read", path);
  return ss.str();
}

absl::Status WriteFileAtomic(const std::string& path, std::string_view contents) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "cannot create", tmp);
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoStatus(err, "cannot write", tmp);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot sync", tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot rename to", path);
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return SyncDir(dir.empty() ? "." : dir);
}

absl::Status MakeDirs(const std::string& path, int mode) {
  std::error_code ec;
  std::filesystem::path p(path);
  std::filesystem::path cur;
  for (const auto& part : p) {
    cur /= part;
    if (std::filesystem::is_directory(cur, ec)) continue;
    if (::mkdir(cur.c_str(), static_cast<mode_t>(mode)) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, "cannot create directory", cur.string());
    }
  }
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open directory", path);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : ErrnoStatus(err, "cannot sync directory", path);
}

}  // namespace oomb
