// Confined file access: every file a job reads or writes is opened through a FileAccess, so
// that what an API client names cannot make the daemon read or write anything but what the
// operator allowed (docs/RELIABILITY.md, threat model).
//
// A FileAccess holds a set of roots (directories opened once, when it is made) and a set of
// excluded subtrees (the daemon's data dir). Opening a path under it:
//   - resolves the path beneath the root that contains it, at the moment of the open
//     (openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS where the
//     kernel has it, else one openat per component with O_NOFOLLOW): no symbolic link below
//     the root is followed, and no `..` leaves it, whatever happens to the path meanwhile;
//   - refuses paths inside an excluded subtree (the path is the file's real path, as no link
//     was followed);
//   - opens files only if they are regular files (O_NONBLOCK, then fstat: a FIFO, socket,
//     device or directory is refused without blocking);
//   - hands back a descriptor (File, Dir). Everything done beneath a Dir happens in the
//     directory that was opened, by single-component names with O_NOFOLLOW: replacing the
//     directory's path with a link later changes nothing.
// An unconfined FileAccess (the daemon user at a terminal: `oombd run`, `oombd model ...`)
// has the root "/" and follows links, as open(2) does; it still opens only regular files.
//
// Errors name the path: NOT_FOUND (missing), PERMISSION_DENIED (outside every root, inside an
// excluded subtree, a link where none may be, or the system's EACCES), INVALID_ARGUMENT (not
// a regular file or not a directory where one is expected, a bad or too long name), RESOURCE_EXHAUSTED
// (disk full, quota), INTERNAL (other system errors). Callers prefix the spec field.
//
// Thread-safety: FileAccess, File and Dir are immutable after creation; their methods may be
// called from any thread. A File is move-only; copies of a Dir share one descriptor.
#ifndef OOMB_WORKER_COMMON_FILE_ACCESS_H_
#define OOMB_WORKER_COMMON_FILE_ACCESS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace oomb {

// An owned file descriptor; closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// An open regular file, read-only.
class File {
 public:
  File(UniqueFd fd, std::string path, int64_t size) : fd_(std::move(fd)), path_(std::move(path)), size_(size) {}

  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }  // at the open
  // The whole file; INVALID_ARGUMENT when it is larger than `max_bytes`.
  absl::StatusOr<std::string> ReadAll(int64_t max_bytes = int64_t{1} << 30) const;

 private:
  UniqueFd fd_;
  std::string path_;
  int64_t size_;
};

// What a directory entry is, without following links.
enum class EntryType { kFile, kDirectory, kOther };

struct DirEntry {
  std::string name;
  EntryType type;
};

// An open directory. Names passed to its methods are single path components: not empty, not
// "." or "..", no '/' (INVALID_ARGUMENT otherwise); links among them are never followed when
// confined (PERMISSION_DENIED), and followed when not.
class Dir {
 public:
  Dir(UniqueFd fd, std::string path, bool follow_links)
      : fd_(std::make_shared<UniqueFd>(std::move(fd))), path_(std::move(path)), follow_links_(follow_links) {}

  int fd() const { return fd_->get(); }
  const std::string& path() const { return path_; }
  // `name` under this directory's path, for messages and records.
  std::string PathOf(absl::string_view name) const;

  absl::StatusOr<File> OpenFile(absl::string_view name) const;
  absl::StatusOr<std::string> ReadFile(absl::string_view name, int64_t max_bytes = int64_t{1} << 30) const;
  absl::StatusOr<Dir> OpenDir(absl::string_view name) const;
  // What `name` is; NOT_FOUND when absent.
  absl::StatusOr<EntryType> TypeOf(absl::string_view name) const;
  bool Contains(absl::string_view name) const { return TypeOf(name).ok(); }
  // Entries other than "." and "..", sorted by name.
  absl::StatusOr<std::vector<DirEntry>> List() const;

  // Opens `name`, creating it (with `mode`) when absent.
  absl::StatusOr<Dir> MakeDir(absl::string_view name, int mode = 0755) const;
  // Writes `name` atomically: `write(fd)` fills a temporary file in this directory, which is
  // fsync'ed and renamed over `name`, and the directory fsync'ed. A reader sees the old file
  // or the new one, never a torn one, also after a crash.
  absl::Status WriteAtomic(absl::string_view name, const std::function<absl::Status(int fd)>& write,
                           int mode = 0644) const;
  absl::Status WriteFileAtomic(absl::string_view name, absl::string_view contents, int mode = 0644) const;
  // Opens `name` for appending (created with `mode` when absent); the descriptor is the caller's.
  absl::StatusOr<UniqueFd> OpenAppend(absl::string_view name, int mode = 0644) const;
  // Creates `name` exclusively with `contents` (fsync'ed); ALREADY_EXISTS when it exists.
  absl::Status CreateExclusive(absl::string_view name, absl::string_view contents, int mode = 0644) const;
  // renameat(2) within this directory (replaces an empty directory or a file at `to`).
  absl::Status Rename(absl::string_view from, absl::string_view to) const;
  // Removes `name` and, for a directory, everything beneath it; links are removed, never
  // followed. OK when absent.
  absl::Status RemoveTree(absl::string_view name) const;
  // fsync(2) of the directory: makes creations, renames and removals in it durable.
  absl::Status Sync() const;

 private:
  absl::Status CheckName(absl::string_view name) const;
  int NoFollow() const;

  std::shared_ptr<UniqueFd> fd_;  // shared by copies
  std::string path_;
  bool follow_links_;
};

class FileAccess {
 public:
  struct Options {
    // Absolute directories beneath which paths may be opened; each must exist. Links in a
    // root's own path are resolved once, here (a path may be given under either spelling). A
    // root inside an excluded subtree grants what lies beneath it (the daemon's own files a
    // job may read: an uploaded dataset, an earlier job's checkpoint); the rest of the subtree
    // stays excluded.
    std::vector<std::string> roots;
    // Absolute directories whose contents are never opened, even beneath a root.
    std::vector<std::string> excluded;
    // false: resolve by the per-component walk even where openat2(2) exists (the path a kernel
    // before 5.6 takes; for its tests).
    bool openat2 = true;
  };
  // INVALID_ARGUMENT naming the root that is not an absolute, existing directory.
  static absl::StatusOr<std::shared_ptr<const FileAccess>> Create(Options options);
  // Root "/", links followed, nothing excluded.
  static std::shared_ptr<const FileAccess> Unconfined();

  // A regular file, read-only. Confined, a file of several hard links is refused when one of
  // them lies in an excluded subtree (a link to the daemon's own store named as a dataset);
  // files opened beneath a Dir are not checked so (docs/RELIABILITY.md, "Trust boundary: hard links").
  absl::StatusOr<File> OpenFile(const std::string& path) const;
  // The whole of a regular file; INVALID_ARGUMENT when it is larger than `max_bytes`.
  absl::StatusOr<std::string> ReadFile(const std::string& path, int64_t max_bytes = int64_t{1} << 30) const;
  absl::StatusOr<Dir> OpenDir(const std::string& path) const;
  // Opens `path`, creating it and its missing parents (with `mode`) when absent.
  absl::StatusOr<Dir> MakeDirs(const std::string& path, int mode = 0755) const;
  // Whether `path` could be opened here at all (absolute, beneath a root, outside every
  // excluded subtree), without touching the filesystem: an early, friendlier refusal. The
  // opens above check again.
  absl::Status CheckPath(const std::string& path) const;

  bool confined() const { return confined_; }
  // The roots' real paths, for messages.
  std::vector<std::string> roots() const;

  FileAccess(const FileAccess&) = delete;
  FileAccess& operator=(const FileAccess&) = delete;
  ~FileAccess();

 private:
  struct Root;
  FileAccess() = default;
  // The root containing `path` and the path's components beneath it.
  absl::StatusOr<std::pair<const Root*, std::vector<std::string>>> Locate(const std::string& path) const;
  // Opens the components beneath `root` with `flags` for the last one, following no link.
  absl::StatusOr<UniqueFd> OpenBeneath(const Root& root, const std::vector<std::string>& parts, int flags,
                                       const std::string& path) const;
  // The open itself: invalid with errno set on failure (ELOOP for a link on the way).
  UniqueFd Resolve(const Root& root, const std::vector<std::string>& parts, int flags) const;
  // PERMISSION_DENIED when the regular file `fd` has another hard link in an excluded subtree.
  absl::Status CheckNotLinkedIntoExcluded(int fd, const std::string& path) const;

  std::vector<std::unique_ptr<Root>> roots_;
  std::vector<std::string> excluded_;
  bool confined_ = true;
  bool openat2_ = true;
};

// The status of a failed system call on `path`: "<path>: <strerror> (<what>)", e.g.
// "/d/a.jsonl: No such file or directory (open)", coded NOT_FOUND
// (ENOENT), RESOURCE_EXHAUSTED with reason DISK_FULL (ENOSPC, EDQUOT), PERMISSION_DENIED (EACCES,
// EPERM), INVALID_ARGUMENT (ENAMETOOLONG, ENOTDIR, EISDIR, ELOOP: the path is at fault) or
// INTERNAL.
absl::Status ErrnoStatus(int err, const char* what, const std::string& path);

}  // namespace oomb

#endif  // OOMB_WORKER_COMMON_FILE_ACCESS_H_
