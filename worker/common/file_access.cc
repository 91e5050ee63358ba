#include "worker/common/file_access.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "worker/common/status.h"

namespace oomb {
namespace {

namespace fs = std::filesystem;

// Whether the kernel has openat2(2) (Linux 5.6+); learnt from the first call.
std::atomic<int> openat2_state{0};  // 0: unknown, 1: yes, -1: no

// openat2 resolving beneath `dirfd` without following any link; -1 with errno, or ENOSYS when
// the kernel lacks it.
int OpenAt2Beneath(int dirfd, const std::string& relative, int flags, int mode) {
  if (openat2_state.load(std::memory_order_relaxed) < 0) {
    errno = ENOSYS;
    return -1;
  }
  open_how how{};
  how.flags = static_cast<uint64_t>(flags);
  how.mode = (flags & O_CREAT) ? static_cast<uint64_t>(mode) : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  const long fd = ::syscall(SYS_openat2, dirfd, relative.c_str(), &how, sizeof how);
  if (fd < 0 && (errno == ENOSYS || errno == EPERM) && openat2_state.load() == 0) {
    // ENOSYS: an old kernel; EPERM: a seccomp filter that refuses the call.
    openat2_state.store(-1);
    errno = ENOSYS;
    return -1;
  }
  if (fd >= 0) openat2_state.store(1, std::memory_order_relaxed);
  return static_cast<int>(fd);
}

// Lexical normalisation of an absolute path into its components ("." dropped, ".." popped).
std::vector<std::string> Components(const std::string& path) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (part == ".") continue;
    if (part == "..") {
      if (!out.empty()) out.pop_back();
      continue;
    }
    out.emplace_back(part);
  }
  return out;
}

std::string JoinComponents(const std::vector<std::string>& parts) {
  return parts.empty() ? "/" : absl::StrCat("/", absl::StrJoin(parts, "/"));
}

bool HasPrefix(const std::vector<std::string>& parts, const std::vector<std::string>& prefix) {
  return parts.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), parts.begin());
}

// After an open that refused to follow a link: the error, in words.
absl::Status OpenError(int err, const std::string& path, bool confined) {
  if (confined && (err == ELOOP || err == EXDEV)) {
    return WithReason(
        absl::PermissionDeniedError(absl::StrCat(
            path, ": a symbolic link (or a path through one); job files are opened without following links")),
        Reason::kPathDenied);
  }
  if (err == ENOTDIR)
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a directory (or a component is not)"));
  return ErrnoStatus(err, "open", path);
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "write", path);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

const char* TypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "an unknown kind of file";
}

// `fd`, opened O_NONBLOCK, as a File when it is a regular file (and blocking again).
absl::StatusOr<File> AsRegularFile(UniqueFd fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file (", TypeName(st.st_mode), ")"));
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  return File(std::move(fd), path, static_cast<int64_t>(st.st_size));
}

// ".<name>.tmp-<pid>-<n>": a temporary file beside `name`, unique in this process
// (RemovePartialCheckpoints knows the pattern).
std::string TemporaryName(absl::string_view name) {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat(".", name, ".tmp-", ::getpid(), "-", counter.fetch_add(1));
}

}  // namespace

absl::Status ErrnoStatus(int err, const char* what, const std::string& path) {
  const std::string msg = absl::StrCat(path, ": ", std::strerror(err), " (", what, ")");
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == ENOSPC || err == EDQUOT) return WithReason(absl::ResourceExhaustedError(msg), Reason::kDiskFull);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  // The caller's path, not the system, is at fault: a name too long, a file where a directory
  // belongs, a directory where a file does.
  if (err == ENAMETOOLONG || err == ENOTDIR || err == EISDIR || err == ELOOP) return absl::InvalidArgumentError(msg);
  return absl::InternalError(msg);
}

// ---------------------------------------------------------------------------------------------
// UniqueFd, File

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

absl::StatusOr<std::string> File::ReadAll(int64_t max_bytes) const {
  if (size_ > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", size_, " bytes, more than the ", max_bytes, " read"));
  }
  std::string out;
  out.resize(static_cast<size_t>(size_));
  size_t done = 0;
  for (;;) {
    if (done == out.size()) {
      if (static_cast<int64_t>(out.size()) >= max_bytes + 1) break;
      out.resize(std::min<size_t>(out.size() * 2 + 4096, static_cast<size_t>(max_bytes) + 1));
    }
    const ssize_t n = ::pread(fd(), out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read", path_);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  if (static_cast<int64_t>(done) > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": more than the ", max_bytes, " bytes read"));
  }
  out.resize(done);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Dir

std::string Dir::PathOf(absl::string_view name) const {
  return path_ == "/" ? absl::StrCat("/", name) : absl::StrCat(path_, "/", name);
}

absl::Status Dir::CheckName(absl::string_view name) const {
  if (name.empty() || name == "." || name == ".." || name.find('/') != absl::string_view::npos ||
      name.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": '", name, "' is not a plain file name"));
  }
  return absl::OkStatus();
}

int Dir::NoFollow() const { return follow_links_ ? 0 : O_NOFOLLOW; }

absl::StatusOr<File> Dir::OpenFile(absl::string_view name) const {
  OOMB_RETURN_IF_ERROR(CheckName(name));
  const std::string n(name);
  UniqueFd fd(::openat(fd_->get(), n.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | NoFollow()));
  if (!fd.valid()) return OpenError(errno, PathOf(name), !follow_links_);
  return AsRegularFile(std::move(fd), PathOf(name));
}

absl::StatusOr<std::string> Dir::ReadFile(absl::string_view name, int64_t max_bytes) const {
  OOMB_ASSIGN_OR_RETURN(File f, OpenFile(name));
  return f.ReadAll(max_bytes);
}

absl::StatusOr<Dir> Dir::OpenDir(absl::string_view name) const {
  OOMB_RETURN_IF_ERROR(CheckName(name));
  const std::string n(name);
  UniqueFd fd(::openat(fd_->get(), n.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | NoFollow()));
  if (!fd.valid()) {
    const int err = errno;
    struct stat st;
    if (err == ENOTDIR && !follow_links_ && ::fstatat(fd_->get(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISLNK(st.st_mode)) {
      return OpenError(ELOOP, PathOf(name), true);
    }
    if (err == ENOTDIR) return absl::InvalidArgumentError(absl::StrCat(PathOf(name), ": not a directory"));
    return OpenError(err, PathOf(name), !follow_links_);
  }
  return Dir(std::move(fd), PathOf(name), follow_links_);
}

absl::StatusOr<EntryType> Dir::TypeOf(absl::string_view name) const {
  OOMB_RETURN_IF_ERROR(CheckName(name));
  const std::string n(name);
  struct stat st;
  if (::fstatat(fd_->get(), n.c_str(), &st, follow_links_ ? 0 : AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoStatus(errno, "stat", PathOf(name));
  }
  if (S_ISREG(st.st_mode)) return EntryType::kFile;
  if (S_ISDIR(st.st_mode)) return EntryType::kDirectory;
  return EntryType::kOther;
}

absl::StatusOr<std::vector<DirEntry>> Dir::List() const {
  const int dup = ::openat(fd_->get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dup < 0) return ErrnoStatus(errno, "list", path_);
  DIR* d = ::fdopendir(dup);
  if (d == nullptr) {
    const int err = errno;
    ::close(dup);
    return ErrnoStatus(err, "list", path_);
  }
  std::vector<DirEntry> out;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    absl::StatusOr<EntryType> type = TypeOf(name);
    if (type.ok()) out.push_back({name, *type});
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(), [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
  return out;
}

absl::StatusOr<Dir> Dir::MakeDir(absl::string_view name, int mode) const {
  OOMB_RETURN_IF_ERROR(CheckName(name));
  const std::string n(name);
  if (::mkdirat(fd_->get(), n.c_str(), static_cast<mode_t>(mode)) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, "create directory", PathOf(name));
  }
  return OpenDir(name);
}

absl::Status Dir::WriteAtomic(absl::string_view name, const std::function<absl::Status(int fd)>& write,
                              int mode) const {
  OOMB_RETURN_IF_ERROR(CheckName(name));
  const std::string tmp = TemporaryName(name);
  const std::string tmp_path = PathOf(tmp);
  UniqueFd fd(::openat(fd_->get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                       static_cast<mode_t>(mode)));
  if (!fd.valid()) return ErrnoStatus(errno, "create", tmp_path);
  absl::Status s = write(fd.get());
  if (s.ok() && ::fsync(fd.get()) != 0) s = ErrnoStatus(errno, "sync", tmp_path);
  if (s.ok() && ::close(fd.release()) != 0) s = ErrnoStatus(errno, "close", tmp_path);
  const std::string n(name);
  if (s.ok() && ::renameat(fd_->get(), tmp.c_str(), fd_->get(), n.c_str()) != 0) {
    s = ErrnoStatus(errno, "rename to", PathOf(name));
  }
  if (!s.ok()) {
    ::unlinkat(fd_->get(), tmp.c_str(), 0);
    return s;
  }
  return Sync();
}

absl::Status Dir::WriteFileAtomic(absl::string_view name, absl::string_view contents, int mode) const {
  const std::string path = PathOf(name);
  return WriteAtomic(
      name, [&](int fd) { return WriteAll(fd, contents, path); }, mode);
}

absl::StatusOr<UniqueFd> Dir::OpenAppend(absl::string_view name, int mode) const {
  OOMB_RETURN_IF_ERROR(CheckName(name));
  const std::string n(name);
  UniqueFd fd(::openat(fd_->get(), n.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK | NoFollow(),
                       static_cast<mode_t>(mode)));
  if (!fd.valid()) return OpenError(errno, PathOf(name), !follow_links_);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat", PathOf(name));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(PathOf(name), ": not a regular file (", TypeName(st.st_mode), ")"));
  }
  return fd;
}

absl::Status Dir::CreateExclusive(absl::string_view name, absl::string_view contents, int mode) const {
  OOMB_RETURN_IF_ERROR(CheckName(name));
  // Written whole under a temporary name, then linked to `name`, which fails if `name` exists:
  // a crash leaves no empty or partial `name` behind.
  const std::string tmp = TemporaryName(name);
  const std::string n(name);
  UniqueFd fd(::openat(fd_->get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                       static_cast<mode_t>(mode)));
  if (!fd.valid()) return ErrnoStatus(errno, "create", PathOf(tmp));
  absl::Status s = WriteAll(fd.get(), contents, PathOf(tmp));
  if (s.ok() && ::fsync(fd.get()) != 0) s = ErrnoStatus(errno, "sync", PathOf(tmp));
  if (s.ok() && ::linkat(fd_->get(), tmp.c_str(), fd_->get(), n.c_str(), 0) != 0) {
    s = errno == EEXIST ? absl::AlreadyExistsError(absl::StrCat(PathOf(name), " exists"))
                        : ErrnoStatus(errno, "link", PathOf(name));
  }
  ::unlinkat(fd_->get(), tmp.c_str(), 0);
  if (!s.ok()) return s;
  return Sync();
}

absl::Status Dir::Rename(absl::string_view from, absl::string_view to) const {
  OOMB_RETURN_IF_ERROR(CheckName(from));
  OOMB_RETURN_IF_ERROR(CheckName(to));
  const std::string f(from), t(to);
  if (::renameat(fd_->get(), f.c_str(), fd_->get(), t.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("rename from ", from).c_str(), PathOf(to));
  }
  return absl::OkStatus();
}

absl::Status Dir::RemoveTree(absl::string_view name) const {
  OOMB_RETURN_IF_ERROR(CheckName(name));
  const std::string n(name);
  struct stat st;
  if (::fstatat(fd_->get(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno == ENOENT ? absl::OkStatus() : ErrnoStatus(errno, "stat", PathOf(name));
  }
  if (S_ISDIR(st.st_mode)) {
    UniqueFd sub(::openat(fd_->get(), n.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
    if (!sub.valid()) return ErrnoStatus(errno, "open", PathOf(name));
    const Dir child(std::move(sub), PathOf(name), /*follow_links=*/false);
    OOMB_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, child.List());
    for (const DirEntry& e : entries) OOMB_RETURN_IF_ERROR(child.RemoveTree(e.name));
    if (::unlinkat(fd_->get(), n.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, "remove", PathOf(name));
    }
    return absl::OkStatus();
  }
  if (::unlinkat(fd_->get(), n.c_str(), 0) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, "remove", PathOf(name));
  }
  return absl::OkStatus();
}

absl::Status Dir::Sync() const {
  if (::fsync(fd_->get()) != 0) return ErrnoStatus(errno, "sync directory", path_);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// FileAccess

struct FileAccess::Root {
  std::vector<std::vector<std::string>> spellings;  // the real path first, then the one given
  std::string real;
  UniqueFd fd;  // O_PATH | O_DIRECTORY
};

FileAccess::~FileAccess() = default;

absl::StatusOr<std::shared_ptr<const FileAccess>> FileAccess::Create(Options options) {
  std::shared_ptr<FileAccess> access(new FileAccess());
  access->openat2_ = options.openat2;
  for (const std::string& given : options.roots) {
    if (given.empty() || given[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat("'", given, "' is not an absolute path"));
    }
    std::error_code ec;
    const fs::path real = fs::canonical(given, ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat(given, ": ", ec.message()));
    auto root = std::make_unique<Root>();
    root->real = real.string();
    root->spellings.push_back(Components(root->real));
    if (Components(given) != root->spellings.front()) root->spellings.push_back(Components(given));
    root->fd = UniqueFd(::open(root->real.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!root->fd.valid()) return ErrnoStatus(errno, "open", given);
    access->roots_.push_back(std::move(root));
  }
  for (const std::string& given : options.excluded) {
    std::error_code ec;
    const fs::path real = fs::weakly_canonical(given, ec);
    access->excluded_.push_back(ec ? given : real.string());
  }
  return std::shared_ptr<const FileAccess>(std::move(access));
}

std::shared_ptr<const FileAccess> FileAccess::Unconfined() {
  static const std::shared_ptr<const FileAccess> kUnconfined = [] {
    std::shared_ptr<FileAccess> access(new FileAccess());
    auto root = std::make_unique<Root>();
    root->real.assign(1, '/');
    root->spellings.emplace_back();
    root->fd = UniqueFd(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
    access->roots_.push_back(std::move(root));
    access->confined_ = false;
    return std::shared_ptr<const FileAccess>(std::move(access));
  }();
  return kUnconfined;
}

std::vector<std::string> FileAccess::roots() const {
  std::vector<std::string> out;
  for (const auto& r : roots_) out.push_back(r->real);
  return out;
}

absl::Status FileAccess::CheckPath(const std::string& path) const { return Locate(path).status(); }

absl::StatusOr<std::pair<const FileAccess::Root*, std::vector<std::string>>> FileAccess::Locate(
    const std::string& path) const {
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("must be an absolute path, got '", Excerpt(path, 200),
                                                   "' (the oomb CLI makes relative paths absolute)"));
  }
  if (path.find('\0') != std::string::npos) return absl::InvalidArgumentError("a path contains a NUL byte");
  const std::vector<std::string> parts = Components(path);
  if (!confined_) return std::make_pair(roots_.front().get(), parts);
  const Root* best = nullptr;
  size_t best_len = 0;
  std::vector<std::string> real_parts;
  for (const auto& root : roots_) {
    for (const std::vector<std::string>& spelling : root->spellings) {
      if (HasPrefix(parts, spelling) && (best == nullptr || spelling.size() > best_len)) {
        best = root.get();
        best_len = spelling.size();
        real_parts = root->spellings.front();
        real_parts.insert(real_parts.end(), parts.begin() + static_cast<ptrdiff_t>(spelling.size()), parts.end());
      }
    }
  }
  if (best == nullptr) {
    return WithReason(absl::PermissionDeniedError(
                          absl::StrCat(path, " is outside the directories this server may use (paths.allowed_roots: ",
                                       absl::StrJoin(roots(), ", "), ")")),
                      Reason::kPathDenied);
  }
  for (const std::string& excluded : excluded_) {
    // A root granted inside an excluded subtree opens what lies beneath it (Options::roots).
    if (HasPrefix(real_parts, Components(excluded)) && !HasPrefix(best->spellings.front(), Components(excluded))) {
      return WithReason(absl::PermissionDeniedError(absl::StrCat(path, " is inside the server's data directory (",
                                                                 excluded, "), which jobs may not use")),
                        Reason::kPathDenied);
    }
  }
  std::vector<std::string> beneath(real_parts.begin() + static_cast<ptrdiff_t>(best->spellings.front().size()),
                                   real_parts.end());
  return std::make_pair(best, std::move(beneath));
}

absl::StatusOr<UniqueFd> FileAccess::OpenBeneath(const Root& root, const std::vector<std::string>& parts, int flags,
                                                 const std::string& path) const {
  if (!confined_) {
    const std::string p = JoinComponents(parts);
    UniqueFd fd(::open(p.c_str(), flags));
    if (!fd.valid()) return OpenError(errno, path, false);
    return fd;
  }
  UniqueFd fd = Resolve(root, parts, flags);
  if (fd.valid()) return fd;
  const int err = errno;
  if (err == ENOTDIR) {
    // O_DIRECTORY | O_NOFOLLOW on a link says ENOTDIR: tell a link from a file.
    UniqueFd probe = Resolve(root, parts, O_PATH | O_CLOEXEC);
    struct stat st;
    if (!probe.valid() ? errno == ELOOP : ::fstat(probe.get(), &st) == 0 && S_ISLNK(st.st_mode)) {
      return OpenError(ELOOP, path, true);
    }
  }
  return OpenError(err, path, true);
}

UniqueFd FileAccess::Resolve(const Root& root, const std::vector<std::string>& parts, int flags) const {
  if (openat2_) {
    const std::string relative = parts.empty() ? "." : absl::StrJoin(parts, "/");
    const int fd = OpenAt2Beneath(root.fd.get(), relative, flags | O_NOFOLLOW, 0);
    if (fd >= 0 || errno != ENOSYS) return UniqueFd(fd);
  }
  // One component at a time, never following a link.
  UniqueFd dir(::openat(root.fd.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  for (size_t i = 0; dir.valid() && i + 1 < parts.size(); ++i) {
    UniqueFd next(::openat(dir.get(), parts[i].c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
    if (!next.valid() && errno == ENOTDIR) {
      struct stat st;
      if (::fstatat(dir.get(), parts[i].c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) errno = ELOOP;
    }
    dir = std::move(next);
  }
  if (!dir.valid()) return dir;
  return UniqueFd(::openat(dir.get(), parts.empty() ? "." : parts.back().c_str(), flags | O_NOFOLLOW));
}

absl::StatusOr<File> FileAccess::OpenFile(const std::string& path) const {
  OOMB_ASSIGN_OR_RETURN(auto located, Locate(path));
  if (confined_ && !excluded_.empty()) {
    // Checked through an O_PATH descriptor, whose close drops no POSIX lock: closing a real
    // descriptor of the daemon's own database would release the store's SQLite locks.
    OOMB_ASSIGN_OR_RETURN(UniqueFd probe, OpenBeneath(*located.first, located.second, O_PATH | O_CLOEXEC, path));
    OOMB_RETURN_IF_ERROR(CheckNotLinkedIntoExcluded(probe.get(), path));
  }
  OOMB_ASSIGN_OR_RETURN(
      UniqueFd fd, OpenBeneath(*located.first, located.second, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, path));
  return AsRegularFile(std::move(fd), path);
}

absl::Status FileAccess::CheckNotLinkedIntoExcluded(int fd, const std::string& path) const {
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink < 2) return absl::OkStatus();
  for (const std::string& excluded : excluded_) {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(excluded, fs::directory_options::skip_permission_denied, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      struct stat other;
      if (::lstat(it->path().c_str(), &other) == 0 && other.st_dev == st.st_dev && other.st_ino == st.st_ino) {
        return WithReason(
            absl::PermissionDeniedError(absl::StrCat(path, " is a hard link to a file of the server's data directory (",
                                                     excluded, "), which jobs may not use")),
            Reason::kPathDenied);
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileAccess::ReadFile(const std::string& path, int64_t max_bytes) const {
  OOMB_ASSIGN_OR_RETURN(File f, OpenFile(path));
  return f.ReadAll(max_bytes);
}

absl::StatusOr<Dir> FileAccess::OpenDir(const std::string& path) const {
  OOMB_ASSIGN_OR_RETURN(auto located, Locate(path));
  OOMB_ASSIGN_OR_RETURN(UniqueFd fd,
                        OpenBeneath(*located.first, located.second, O_RDONLY | O_DIRECTORY | O_CLOEXEC, path));
  return Dir(std::move(fd), JoinComponents(Components(path)), !confined_);
}

absl::StatusOr<Dir> FileAccess::MakeDirs(const std::string& path, int mode) const {
  OOMB_ASSIGN_OR_RETURN(auto located, Locate(path));
  OOMB_ASSIGN_OR_RETURN(UniqueFd root, OpenBeneath(*located.first, {}, O_RDONLY | O_DIRECTORY | O_CLOEXEC, path));
  std::vector<std::string> so_far = Components(path);
  so_far.resize(so_far.size() - located.second.size());
  Dir dir(std::move(root), JoinComponents(so_far), !confined_);
  for (const std::string& part : located.second) {
    OOMB_ASSIGN_OR_RETURN(dir, dir.MakeDir(part, mode));
  }
  return dir;
}

}  // namespace oomb
