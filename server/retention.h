// storage.retention_days: what a deleted job left in the data dir (<data_dir>/jobs/<id>: its
// default checkpoints and metrics.jsonl) is removed that long after its deletion (DeleteJob marks
// the directory's time; purge: true removes everything at once instead). A chosen
// checkpoint.dir lies beneath the user's own roots and is never removed by retention. Checked
// when the daemon starts and every hour, on a thread of its own.
//
// Thread-safety: SweepOnce may be called from any thread; the destructor stops and joins.
#ifndef OOMB_SERVER_RETENTION_H_
#define OOMB_SERVER_RETENTION_H_

#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/job_files.h"
#include "server/store/job_store.h"

namespace oomb::server {

class RetentionSweeper {
 public:
  // Starts the thread (first sweep at once). `keep` > 0.
  RetentionSweeper(JobStore* store, std::shared_ptr<const JobFiles> files, absl::Duration keep);
  ~RetentionSweeper();
  RetentionSweeper(const RetentionSweeper&) = delete;
  RetentionSweeper& operator=(const RetentionSweeper&) = delete;

  // Removes the job directories older than `keep` whose job is no longer in the store; returns
  // how many.
  int SweepOnce();

 private:
  static constexpr absl::Duration kPeriod = absl::Hours(1);
  JobStore* const store_;
  const std::shared_ptr<const JobFiles> files_;
  const absl::Duration keep_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_RETENTION_H_
