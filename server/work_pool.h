// A bounded pool of threads for work too long for gRPC's callback threads (the callback API
// asks that reactions be fast): CreateJob's dataset scan takes seconds per 16 MiB. The pool
// owns its threads: they start in the constructor and are joined in the destructor, after the
// queued work has run. Work runs at a lower CPU priority (nice +5), so reads and health checks
// on the callback threads stay fast while it runs.
//
// Thread-safety: every method may be called from any thread.
#ifndef OOMB_SERVER_WORK_POOL_H_
#define OOMB_SERVER_WORK_POOL_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace oomb::server {

class WorkPool {
 public:
  // `threads` workers; at most `max_queued` tasks wait beyond those running.
  WorkPool(size_t threads, size_t max_queued);
  ~WorkPool();  // runs what is queued, then joins
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  // Queues `task`; false (and `task` dropped, not run) when `max_queued` tasks already wait.
  bool TrySubmit(std::function<void()> task);

 private:
  void Loop();

  const size_t max_queued_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// Lowers the calling thread's CPU priority to the pool's (nice +5).
void LowerThisThreadsPriority();

}  // namespace oomb::server

#endif  // OOMB_SERVER_WORK_POOL_H_
