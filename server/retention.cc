#include "server/retention.h"

#include <spdlog/spdlog.h>

namespace oomb::server {

RetentionSweeper::RetentionSweeper(JobStore* store, std::shared_ptr<const JobFiles> files, absl::Duration keep)
    : store_(store), files_(std::move(files)), keep_(keep) {
  thread_ = std::thread([this] {
    for (;;) {
      SweepOnce();
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), kPeriod)) return;
    }
  });
}

RetentionSweeper::~RetentionSweeper() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

int RetentionSweeper::SweepOnce() {
  int removed = 0;
  for (const std::string& id : files_->JobDirsOlderThan(absl::Now() - keep_)) {
    if (!absl::IsNotFound(store_->Get(id).status())) continue;  // a job of the store, or the store is away
    if (absl::Status s = files_->RemoveJobDir(id); !s.ok()) {
      spdlog::warn("storage.retention_days: removing the files of deleted job {}: {}", id, s.ToString());
      continue;
    }
    spdlog::info("storage.retention_days: removed the files of deleted job {}", id);
    ++removed;
  }
  return removed;
}

}  // namespace oomb::server
