// File helpers with status returns: whole-file reads, atomic writes (temporary + fsync +
// rename), directory creation. Errors name the path and the system error.
#ifndef OOMB_WORKER_COMMON_FILES_H_
#define OOMB_WORKER_COMMON_FILES_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace oomb {

// The status for a failed system call on `path`: "<what> <path>: <strerror>", coded NOT_FOUND
// (ENOENT), RESOURCE_EXHAUSTED (ENOSPC, EDQUOT), PERMISSION_DENIED (EACCES, EPERM) or INTERNAL.
absl::Status ErrnoStatus(int err, const char* what, const std::string& path);

// NOT_FOUND when the file does not exist; INTERNAL (with errno's text) for other failures.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes `contents` to `path` atomically: a reader sees the old file or the new one, never a
// torn one, also after a crash (the data and the directory entry are fsync'ed).
// RESOURCE_EXHAUSTED when the disk is full.
absl::Status WriteFileAtomic(const std::string& path, std::string_view contents);

// mkdir -p with the given mode for created directories.
absl::Status MakeDirs(const std::string& path, int mode = 0755);

// fsync of a directory, making renames and creations inside it durable.
absl::Status SyncDir(const std::string& path);

}  // namespace oomb

#endif  // OOMB_WORKER_COMMON_FILES_H_
