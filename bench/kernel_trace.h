// A window of the GPU's timeline, kernel by kernel, for finding where a long step's time goes
// (bench_train --kernel-trace).
//
// A KernelTrace waits `delay_s` from its construction, then records through CUPTI's activity
// API every kernel, copy and memset that runs on the GPU for `duration_s`, and writes them to
// `path` as tab-separated rows, sorted by start:
//   kind  start_ns  end_ns  stream  grid  block  bytes  name
// (kind: kernel | memcpy | memset; start and end in nanoseconds less the earliest start, which
// is 0 when CUPTI left a record without timestamps: bench/kernel_trace.py drops those; grid and block
// the kernel's thread-block counts; bytes the copy's or memset's size; name the kernel's
// mangled name, or the copy's kind, e.g. HtoD). bench/kernel_trace.py summarizes such files.
//
// The torch profiler (--kernel-profile) records a whole step, too many events for a step of
// minutes; this records a few seconds of one, anywhere in it. Only one may be active at a time,
// and not together with --kernel-profile (both use CUPTI). CUDA builds only.
#ifndef OOMB_BENCH_KERNEL_TRACE_H_
#define OOMB_BENCH_KERNEL_TRACE_H_

#include <string>
#include <thread>

namespace oomb {

class KernelTrace {
 public:
  // Sets CUPTI up; call once, early. (Set up 140 s into a step at 1,370,752 tokens on an H100,
  // with 117 GB of the host pinned, CUPTI failed: CUPTI_ERROR_NOT_INITIALIZED.) False on failure,
  // said on stderr.
  static bool Initialize();

  KernelTrace(std::string path, double delay_s, double duration_s);
  // Waits for the window to end (if it has not yet), then writes the file.
  ~KernelTrace();
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;

 private:
  std::string path_;
  std::thread thread_;
};

}  // namespace oomb

#endif  // OOMB_BENCH_KERNEL_TRACE_H_
