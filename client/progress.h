// The live progress line of `oomb watch` on a terminal: what a job's snapshot and its streamed
// events say, fitted to the terminal's width.
//
//   job-x RUNNING [#########---------------] step 120/400 loss 1.8123 2412 tok/s gpu 61.2 GiB
//       host 12.0 GiB pcie 9.1 GiB/s eta 2h03m
//
// It shows only what is known: before the first step, the job and its state (and, running, that
// it waits for the first step); memory labelled
// by the device the steps run on ("gpu" on CUDA, "mem" on the CPU); host memory and PCIe only
// when pages live on the host. It never moves backwards: events the snapshot already includes
// (a replay from the start) are lines of history, not changes of state or progress, and a
// retried step below the one shown does not pull the bar back. On a narrow terminal the fields
// go in this order until the line fits: the waiting note, PCIe, host memory, device memory, ETA,
// throughput, loss; then the bar narrows, then goes, then the name is shortened.
#ifndef OOMB_CLIENT_PROGRESS_H_
#define OOMB_CLIENT_PROGRESS_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "oomb/v1/jobs.pb.h"

namespace oomb::client {

class ProgressLine {
 public:
  using Clock = std::chrono::steady_clock;

  explicit ProgressLine(std::string name) : name_(std::move(name)) {}

  // The stream's first message: the job as it is now.
  void Snapshot(const v1::Job& job);
  // A streamed event, received at `now`. Returns false for one the snapshot already includes.
  bool Apply(const v1::JobEvent& event, Clock::time_point now);

  // The line, at most `columns` - 1 characters (the last column stays free, so no terminal
  // wraps it).
  std::string Render(int columns) const;

  v1::Job::State state() const { return state_; }

 private:
  std::string name_;
  v1::Job::State state_ = v1::Job::STATE_UNSPECIFIED;
  v1::Progress progress_;
  int64_t snapshot_sequence_ = 0;  // events up to this one are in the snapshot
  // The PCIe rate between the last two steps that arrived live.
  int64_t last_bytes_ = -1;
  Clock::time_point last_time_;
  double pcie_bytes_per_second_ = 0;
};

// The terminal's width in columns (stderr's; else $COLUMNS; else 80).
int TerminalColumns();

}  // namespace oomb::client

#endif  // OOMB_CLIENT_PROGRESS_H_
