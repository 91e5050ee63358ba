// Fan-out of committed job events to live WatchJob streams.
//
// Publishers (the scheduler's device threads, RPC handlers) call Publish() after the store has
// committed the events; subscribers must take them in O(1) without blocking (a bounded buffer;
// on overflow they re-read from the store), so a slow watcher never slows training.
// Events of one job may be published out of order by different threads: subscribers detect
// gaps by sequence number and re-read from the store. Events another daemon committed to a
// shared store (fleet mode) are not published: Changed() tells the job's subscribers to re-read.
//
// Thread-safety: all methods may be called from any thread. Subscriber callbacks run with the
// hub's lock held: they must not call back into the hub.
#ifndef OOMB_SERVER_WATCH_HUB_H_
#define OOMB_SERVER_WATCH_HUB_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "oomb/v1/jobs.pb.h"

namespace oomb::server {

class WatchSubscriber {
 public:
  virtual ~WatchSubscriber() = default;
  // Committed events of the subscribed job, in sequence order within one call.
  virtual void OnEvents(const std::vector<v1::JobEvent>& events) = 0;
  // Another daemon committed events of the job to the shared store: re-read it.
  virtual void OnChangedElsewhere() = 0;
  // The server is shutting down: finish the stream.
  virtual void OnShutdown() = 0;
};

class WatchHub {
 public:
  // After Shutdown(), Subscribe() calls OnShutdown() at once.
  void Subscribe(const std::string& job_id, WatchSubscriber* subscriber);
  void Unsubscribe(const std::string& job_id, WatchSubscriber* subscriber);
  void Publish(const std::string& job_id, const std::vector<v1::JobEvent>& events);
  // Calls OnChangedElsewhere() of the job's subscribers.
  void Changed(const std::string& job_id);
  // Tells every subscriber to finish; later subscribers are told at once.
  void Shutdown();
  int SubscriberCount();

 private:
  absl::Mutex mu_;
  std::map<std::string, std::set<WatchSubscriber*>> subscribers_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_WATCH_HUB_H_
