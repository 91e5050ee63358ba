#include "client/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "client/cli.h"

namespace oomb::client {
namespace {

constexpr int kBarWidth = 24, kMinBarWidth = 8;

// A field of the line and whether it is shown.
struct Field {
  std::string text;
  bool shown = false;
};

}  // namespace

void ProgressLine::Snapshot(const v1::Job& job) {
  state_ = job.state();
  progress_ = job.progress();
  snapshot_sequence_ = job.last_sequence();
}

bool ProgressLine::Apply(const v1::JobEvent& e, Clock::time_point now) {
  if (e.sequence() <= snapshot_sequence_) return false;
  if (e.type() == v1::JobEvent::STATE_CHANGED) state_ = e.state();
  if (e.type() != v1::JobEvent::STEP) return true;
  const v1::Progress& p = e.progress();
  const int64_t bytes = p.pcie_h2d_bytes() + p.pcie_d2h_bytes();
  if (last_bytes_ >= 0 && bytes > last_bytes_) {
    const double dt = std::chrono::duration<double>(now - last_time_).count();
    if (dt > 0) pcie_bytes_per_second_ = static_cast<double>(bytes - last_bytes_) / dt;
  }
  last_bytes_ = bytes;
  last_time_ = now;
  if (p.step() >= progress_.step()) progress_ = p;
  return true;
}

std::string ProgressLine::Render(int columns) const {
  const v1::Progress& p = progress_;
  const bool stepped = p.step() > 0;
  const bool on_gpu = p.device().rfind("cuda", 0) == 0;
  // In the order they are dropped when the line does not fit.
  std::vector<Field> optional = {
      {"(waiting for the first step)", !stepped && state_ == v1::Job::RUNNING},
      {fmt::format("pcie {}/s", Bytes(static_cast<int64_t>(pcie_bytes_per_second_))), pcie_bytes_per_second_ > 0},
      {fmt::format("host {}", Bytes(p.host_memory_bytes())), p.host_memory_bytes() > 0},
      {fmt::format("{} {}", on_gpu ? "gpu" : "mem", Bytes(p.gpu_memory_bytes())), p.gpu_memory_bytes() > 0},
      {fmt::format("eta {}", Duration(p.eta_seconds())), stepped && p.step() < p.total_steps() && p.eta_seconds() > 0},
      {fmt::format("{:.0f} tok/s", p.tokens_per_second()), p.tokens_per_second() > 0},
      {fmt::format("loss {:.4f}", p.loss()), stepped},
  };
  const bool has_total = p.total_steps() > 0;
  const double frac = has_total ? std::min(1.0, static_cast<double>(p.step()) / p.total_steps()) : 0;
  const std::string step = has_total ? fmt::format("step {}/{}", p.step(), p.total_steps()) : "";
  const std::string state = v1::Job::State_Name(state_);
  const auto line = [&](int bar_width, const std::string& name) {
    std::string out = fmt::format("{} {}", name, state);
    if (has_total && bar_width > 0) {
      const int filled = static_cast<int>(frac * bar_width);
      out += fmt::format(" [{}{}]", std::string(filled, '#'), std::string(bar_width - filled, '-'));
    }
    if (has_total) out += " " + step;
    // Shown fields in display order: loss, throughput, memory, host, PCIe, ETA, waiting.
    for (const int i : {6, 5, 3, 2, 1, 4, 0}) {
      if (optional[i].shown) out += " " + optional[i].text;
    }
    return out;
  };
  const size_t limit = static_cast<size_t>(std::max(columns - 1, 1));
  for (Field& f : optional) {  // drop fields, least needed first
    if (line(kBarWidth, name_).size() <= limit) return line(kBarWidth, name_);
    f.shown = false;
  }
  for (int bar = kBarWidth; bar >= kMinBarWidth; --bar) {
    if (line(bar, name_).size() <= limit) return line(bar, name_);
  }
  std::string out = line(0, name_);
  if (out.size() > limit) {  // shorten the name: its tail is what tells jobs apart
    const size_t cut = std::min(name_.size(), out.size() - limit + 3);
    out = line(0, "..." + name_.substr(cut));
  }
  return out.substr(0, limit);
}

int TerminalColumns() {
  winsize ws{};
  if (::ioctl(2, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS"); c != nullptr && std::atoi(c) > 0) return std::atoi(c);
  return 80;
}

}  // namespace oomb::client
