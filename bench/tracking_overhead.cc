// What MLflow tracking costs a training step (issue 55: "tracking adds < 1% to a step's time"):
// the time of MlflowTracker::Step, the only tracking work on the step's thread (it turns the
// step's report into metric objects and appends them to the job's buffer; the sending is the
// tracker's own thread's), measured over many calls with a step report as a real run's, and
// reported beside a step's time (docs/PERFORMANCE.md, "CPU: build, test and service latency").
//
//   bench_tracking_overhead [--calls N] [--step-seconds S]
#include <chrono>
#include <iostream>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "server/notify/mlflow_tracker.h"
#include "server/store/job_store.h"

int main(int argc, char** argv) {
  CLI::App app("MlflowTracker::Step's time per call, against a training step's");
  int64_t calls = 50000;       // x 11 metrics: within the buffer's 1,000,000
  double step_seconds = 1.32;  // Qwen2.5-7B, 16K tokens, one H100 (README)
  app.add_option("--calls", calls, "Step calls timed");
  app.add_option("--step-seconds", step_seconds, "the step time to compare with");
  CLI11_PARSE(app, argc, argv);

  oomb::server::MlflowTracker tracker(nullptr,
                                      {.default_uri = "http://127.0.0.1:1"});  // never started: nothing is sent
  oomb::v1::Job job;
  job.set_name("projects/default/jobs/bench");
  tracker.RunStarted("cuda:0", job, absl::ZeroDuration());
  oomb::StepReport report;
  report.loss = 2.5;
  report.learning_rate = 1e-4;
  report.tokens_per_second = 12000;
  report.step_seconds = step_seconds;
  report.mfu = 0.6;
  report.peak_device_bytes = int64_t{70} << 30;
  report.eval_loss = 2.4;  // an evaluation's step: the most metrics a step gives
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i) {
    report.step = i + 1;
    tracker.Step("cuda:0", report);
  }
  const double per_call = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls;
  std::cout << fmt::format("MlflowTracker::Step: {:.2f} us a call over {} calls; {:.2e} of a {:.2f} s step\n",
                           per_call * 1e6, calls, per_call / step_seconds, step_seconds);
  return 0;
}
