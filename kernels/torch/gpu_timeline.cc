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

std::atomic<bool> enabled{false};
std::atomic<const char*> current_stage{nullptr};

#if defined(OOMB_HAVE_CUDA)
struct Marks {
  std::mutex mu;
  int device = -1;  // the first mark's
  struct Event {
    const char* stage;  // null: none
    const char* name;
    at::cuda::CUDAEvent event;
    std::chrono::steady_clock::time_point host;
  };
  std::vector<Event> events;
};

Marks& State() {
  static Marks* marks = new Marks();  // never destroyed: events outlive static destruction order
  return *marks;
}
#endif

}  // namespace

void Enable(bool on) {
  enabled = on;
#if defined(OOMB_HAVE_CUDA)
  Marks& m = State();
  const std::lock_guard<std::mutex> lock(m.mu);
  m.events.clear();
  m.device = -1;
#endif
}

void Mark(const char* name) {
  if (!enabled) return;
#if defined(OOMB_HAVE_CUDA)
  if (c10::cuda::device_count() == 0) return;
  const int device = c10::cuda::current_device();
  Marks& m = State();
  const std::lock_guard<std::mutex> lock(m.mu);
  if (m.device < 0) m.device = device;
  if (device != m.device) return;
  m.events.push_back(
      {current_stage.load(), name, at::cuda::CUDAEvent(cudaEventDefault), std::chrono::steady_clock::now()});
  m.events.back().event.record(at::cuda::getCurrentCUDAStream(device));
#else
  (void)name;
#endif
}

void Stage(const char* stage) { current_stage = stage; }

std::map<std::string, double> Collect(std::map<std::string, double>* host_seconds) {
  std::map<std::string, double> seconds;
#if defined(OOMB_HAVE_CUDA)
  Marks& m = State();
  const std::lock_guard<std::mutex> lock(m.mu);
  if (m.events.empty()) return seconds;
  const auto host_end = std::chrono::steady_clock::now();
  at::cuda::CUDAEvent end(cudaEventDefault);
  end.record(at::cuda::getCurrentCUDAStream(m.device));
  end.synchronize();
  const auto add = [](std::map<std::string, double>* to, const Marks::Event& e, double s) {
    (*to)[e.name] += s;
    if (e.stage != nullptr) (*to)[std::string(e.stage) + "/" + e.name] += s;
  };
  for (size_t i = 0; i < m.events.size(); ++i) {
    const bool last = i + 1 == m.events.size();
    const at::cuda::CUDAEvent& next = last ? end : m.events[i + 1].event;
    add(&seconds, m.events[i], static_cast<double>(m.events[i].event.elapsed_time(next)) / 1000.0);
    if (host_seconds != nullptr) {
      const auto host_next = last ? host_end : m.events[i + 1].host;
      add(host_seconds, m.events[i], std::chrono::duration<double>(host_next - m.events[i].host).count());
    }
  }
  m.events.clear();
  m.device = -1;
#else
  (void)host_seconds;
#endif
  return seconds;
}

}  // namespace oomb::kernels::timeline
