#include "kernels/torch/gpu_timeline.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <utility>
#include <vector>

#if defined(OOMB_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace oomb::kernels::timeline {
namespace {

#if defined(OOMB_HAVE_CUDA)
constexpr int kMaxDevices = 64;
std::atomic<int> enabled_devices{0};  // the flag a mark tests first

// One device's timeline.
struct Marks {
  std::mutex mu;
  bool enabled = false;
  const char* stage = nullptr;  // Stage's
  struct Event {
    const char* stage;  // null: none
    const char* name;
    at::cuda::CUDAEvent event;
    std::chrono::steady_clock::time_point host;
  };
  std::vector<Event> events;
};

// The current device's timeline; null on the CPU.
Marks* State() {
  static Marks* marks = new Marks[kMaxDevices];  // never destroyed: events outlive static destruction order
  if (c10::cuda::device_count() == 0) return nullptr;
  const int device = c10::cuda::current_device();
  return device < kMaxDevices ? &marks[device] : nullptr;
}
#endif

}  // namespace

void Enable(bool on) {
#if defined(OOMB_HAVE_CUDA)
  Marks* m = State();
  if (m == nullptr) return;
  const std::lock_guard<std::mutex> lock(m->mu);
  if (m->enabled != on) enabled_devices += on ? 1 : -1;
  m->enabled = on;
  m->events.clear();
#else
  (void)on;
#endif
}

void Mark(const char* name) {
#if defined(OOMB_HAVE_CUDA)
  if (enabled_devices.load() == 0) return;
  Marks* m = State();
  if (m == nullptr) return;
  const std::lock_guard<std::mutex> lock(m->mu);
  if (!m->enabled) return;
  m->events.push_back({m->stage, name, at::cuda::CUDAEvent(cudaEventDefault), std::chrono::steady_clock::now()});
  m->events.back().event.record(at::cuda::getCurrentCUDAStream(c10::cuda::current_device()));
#else
  (void)name;
#endif
}

void Stage(const char* stage) {
#if defined(OOMB_HAVE_CUDA)
  Marks* m = State();
  if (m == nullptr) return;
  const std::lock_guard<std::mutex> lock(m->mu);
  m->stage = stage;
#else
  (void)stage;
#endif
}

std::map<std::string, double> Collect(std::map<std::string, double>* host_seconds) {
  std::map<std::string, double> seconds;
#if defined(OOMB_HAVE_CUDA)
  Marks* m = State();
  if (m == nullptr) return seconds;
  std::vector<Marks::Event> events;
  {
    // Taken out, so that the wait below holds no lock (another thread of this device, the
    // autograd engine's, may still mark).
    const std::lock_guard<std::mutex> lock(m->mu);
    events = std::move(m->events);
    m->events.clear();
  }
  if (events.empty()) return seconds;
  const auto host_end = std::chrono::steady_clock::now();
  at::cuda::CUDAEvent end(cudaEventDefault);
  end.record(at::cuda::getCurrentCUDAStream(c10::cuda::current_device()));
  end.synchronize();
  const auto add = [](std::map<std::string, double>* to, const Marks::Event& e, double s) {
    (*to)[e.name] += s;
    if (e.stage != nullptr) (*to)[std::string(e.stage) + "/" + e.name] += s;
  };
  for (size_t i = 0; i < events.size(); ++i) {
    const bool last = i + 1 == events.size();
    const at::cuda::CUDAEvent& next = last ? end : events[i + 1].event;
    add(&seconds, events[i], static_cast<double>(events[i].event.elapsed_time(next)) / 1000.0);
    if (host_seconds != nullptr) {
      const auto host_next = last ? host_end : events[i + 1].host;
      add(host_seconds, events[i], std::chrono::duration<double>(host_next - events[i].host).count());
    }
  }
#else
  (void)host_seconds;
#endif
  return seconds;
}

}  // namespace oomb::kernels::timeline
