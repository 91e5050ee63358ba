#include "server/watch_hub.h"

namespace oomb::server {

void WatchHub::Subscribe(const std::string& job_id, WatchSubscriber* subscriber) {
  absl::MutexLock lock(&mu_);
  subscribers_[job_id].insert(subscriber);
  if (shutdown_) subscriber->OnShutdown();
}

void WatchHub::Unsubscribe(const std::string& job_id, WatchSubscriber* subscriber) {
  absl::MutexLock lock(&mu_);
  auto it = subscribers_.find(job_id);
  if (it == subscribers_.end()) return;
  it->second.erase(subscriber);
  if (it->second.empty()) subscribers_.erase(it);
}

void WatchHub::Publish(const std::string& job_id, const std::vector<v1::JobEvent>& events) {
  if (events.empty()) return;
  absl::MutexLock lock(&mu_);
  auto it = subscribers_.find(job_id);
  if (it == subscribers_.end()) return;
  for (WatchSubscriber* s : it->second) s->OnEvents(events);
}

void WatchHub::Changed(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = subscribers_.find(job_id);
  if (it == subscribers_.end()) return;
  for (WatchSubscriber* s : it->second) s->OnChangedElsewhere();
}

void WatchHub::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  for (auto& [id, set] : subscribers_) {
    for (WatchSubscriber* s : set) s->OnShutdown();
  }
}

int WatchHub::SubscriberCount() {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (auto& [id, set] : subscribers_) n += static_cast<int>(set.size());
  return n;
}

}  // namespace oomb::server
