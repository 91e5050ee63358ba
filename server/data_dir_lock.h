// One daemon per data dir. A second `oombd serve` on the same data dir would find the first
// one's running jobs in the store, mark them RECOVERING and train them at the same time; it is
// refused at start instead. The lock is an exclusive flock(2) on <data_dir>/oombd.lock, held
// for the life of the process (the kernel drops it when the process dies, kill -9 included);
// the file holds the holder's pid, for the message.
#ifndef OOMB_SERVER_DATA_DIR_LOCK_H_
#define OOMB_SERVER_DATA_DIR_LOCK_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/common/file_access.h"

namespace oomb::server {

class DataDirLock {
 public:
  // FAILED_PRECONDITION naming the data dir and the other daemon's pid when it is held.
  static absl::StatusOr<DataDirLock> Acquire(const std::string& data_dir);

 private:
  explicit DataDirLock(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_DATA_DIR_LOCK_H_
