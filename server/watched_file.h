// A configuration file re-read when it changes (its inode, size or modification time), looked at
// at most once a second: the token file and the projects file, so that teams are added and
// tokens revoked without a restart.
//
// Thread-safety: none; its owner serialises calls (a mutex).
#ifndef OOMB_SERVER_WATCHED_FILE_H_
#define OOMB_SERVER_WATCHED_FILE_H_

#include <sys/types.h>

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace oomb::server {

class WatchedFile {
 public:
  explicit WatchedFile(std::string path) : path_(std::move(path)) {}

  // The file's contents when it changed since they were last returned (always on the first
  // call); nullopt when it did not, or when it was looked at less than a second ago. Errors
  // name the path (it cannot be stat'ed or read); the next call looks again.
  absl::StatusOr<std::optional<std::string>> ReadIfChanged();

  const std::string& path() const { return path_; }

 private:
  const std::string path_;
  bool read_ = false;
  ino_t inode_ = 0;
  off_t size_ = -1;
  timespec mtime_ = {};
  time_t checked_ = 0;
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_WATCHED_FILE_H_
