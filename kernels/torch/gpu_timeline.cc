#include "kernels/torch/gpu_timeline.h"

#include <atomic>
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
  m.events.push_back({current_stage.load(), name, at::cuda::CUDAEvent(cudaEventDefault)});
  m.events.back().event.record(at::cuda::getCurrentCUDAStream(device));
#else
  (void)name;
#endif
}

void Stage(const char* stage) { current_stage = stage; }

std::map<std::string, double> Collect() {
  std::map<std::string, double> seconds;
#if defined(OOMB_HAVE_CUDA)
  Marks& m = State();
  const std::lock_guard<std::mutex> lock(m.mu);
  if (m.events.empty()) return seconds;
  at::cuda::CUDAEvent end(cudaEventDefault);
  end.record(at::cuda::getCurrentCUDAStream(m.device));
  end.synchronize();
  for (size_t i = 0; i < m.events.size(); ++i) {
    const at::cuda::CUDAEvent& next = i + 1 < m.events.size() ? m.events[i + 1].event : end;
    const double s = static_cast<double>(m.events[i].event.elapsed_time(next)) / 1000.0;
    seconds[m.events[i].name] += s;
    if (m.events[i].stage != nullptr) seconds[std::string(m.events[i].stage) + "/" + m.events[i].name] += s;
  }
  m.events.clear();
  m.device = -1;
#endif
  return seconds;
}

}  // namespace oomb::kernels::timeline
