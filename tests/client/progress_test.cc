// The live progress line of `oomb watch` (client/progress.h): it fits the terminal's width,
// shows only what is known, labels memory by the device, and never moves backwards while a
// replay of old events streams in.
#include "client/progress.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace oomb::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::Progress StepProgress(int64_t step, const std::string& device = "cuda:0") {
  v1::Progress p;
  p.set_step(step);
  p.set_total_steps(400);
  p.set_loss(1.8123);
  p.set_tokens_per_second(2412);
  p.set_eta_seconds(7380);
  p.set_gpu_memory_bytes(int64_t{61} << 30);
  p.set_host_memory_bytes(int64_t{12} << 30);
  p.set_pcie_h2d_bytes(step * (int64_t{1} << 30));
  p.set_device(device);
  return p;
}

v1::JobEvent Step(int64_t sequence, int64_t step, const std::string& device = "cuda:0") {
  v1::JobEvent e;
  e.set_sequence(sequence);
  e.set_type(v1::JobEvent::STEP);
  *e.mutable_progress() = StepProgress(step, device);
  return e;
}

v1::JobEvent State(int64_t sequence, v1::Job::State state) {
  v1::JobEvent e;
  e.set_sequence(sequence);
  e.set_type(v1::JobEvent::STATE_CHANGED);
  e.set_state(state);
  return e;
}

v1::Job Running(int64_t last_sequence, int64_t step) {
  v1::Job job;
  job.set_state(v1::Job::RUNNING);
  job.set_last_sequence(last_sequence);
  if (step > 0) *job.mutable_progress() = StepProgress(step);
  return job;
}

TEST(ProgressLineTest, FitsEveryWidthWithoutWrapping) {
  ProgressLine line("job-austen-7b-128k");
  line.Snapshot(Running(0, 0));
  const auto t0 = ProgressLine::Clock::now();
  line.Apply(Step(1, 120), t0);
  line.Apply(Step(2, 121), t0 + std::chrono::seconds(2));
  const std::string wide = line.Render(200);
  EXPECT_THAT(wide, HasSubstr("job-austen-7b-128k RUNNING ["));
  EXPECT_THAT(wide, HasSubstr("] step 121/400 loss 1.8123 2412 tok/s gpu 61.0 GiB host 12.0 GiB pcie 512.0 MiB/s eta"));
  for (const int columns : {120, 80, 60, 40, 20, 8}) {
    const std::string s = line.Render(columns);
    EXPECT_LT(s.size(), static_cast<size_t>(columns)) << columns << ": " << s;
    EXPECT_THAT(s, Not(HasSubstr("\n")));
  }
  // The fields go least needed first: at 80 columns the step and loss stay, PCIe goes.
  const std::string eighty = line.Render(80);
  EXPECT_THAT(eighty, HasSubstr("step 121/400 loss 1.8123"));
  EXPECT_THAT(eighty, Not(HasSubstr("pcie")));
  EXPECT_THAT(line.Render(40), HasSubstr("RUNNING"));
}

TEST(ProgressLineTest, ShowsOnlyWhatIsKnown) {
  ProgressLine line("job-x");
  v1::Job queued;
  queued.set_state(v1::Job::QUEUED);
  line.Snapshot(queued);
  EXPECT_EQ(line.Render(200), "job-x QUEUED");
  line.Apply(State(1, v1::Job::RUNNING), ProgressLine::Clock::now());
  EXPECT_EQ(line.Render(200), "job-x RUNNING (waiting for the first step)");
  // A CPU job: its memory is not a GPU's; without host pages, no host or PCIe fields.
  v1::JobEvent cpu = Step(2, 1, "cpu");
  cpu.mutable_progress()->set_host_memory_bytes(0);
  cpu.mutable_progress()->set_pcie_h2d_bytes(0);
  line.Apply(cpu, ProgressLine::Clock::now());
  const std::string s = line.Render(200);
  EXPECT_THAT(s, HasSubstr("mem 61.0 GiB"));
  EXPECT_THAT(s, Not(HasSubstr("gpu")));
  EXPECT_THAT(s, Not(HasSubstr("host")));
  EXPECT_THAT(s, Not(HasSubstr("pcie")));
  EXPECT_THAT(s, Not(HasSubstr("waiting")));
}

// Watching a job from the start replays its history after a snapshot of its present: the old
// QUEUED and RUNNING changes and old steps do not move the line; live events do; a retried step
// below the one shown does not pull it back.
TEST(ProgressLineTest, NeverMovesBackwards) {
  ProgressLine line("job-x");
  line.Snapshot(Running(/*last_sequence=*/6, /*step=*/100));
  const auto now = ProgressLine::Clock::now();
  EXPECT_FALSE(line.Apply(State(1, v1::Job::QUEUED), now));
  EXPECT_FALSE(line.Apply(State(2, v1::Job::RUNNING), now));
  EXPECT_FALSE(line.Apply(Step(3, 1), now));
  EXPECT_FALSE(line.Apply(State(4, v1::Job::QUEUED), now));
  EXPECT_EQ(line.state(), v1::Job::RUNNING);
  EXPECT_THAT(line.Render(200), HasSubstr("RUNNING [######------------------] step 100/400"));
  EXPECT_TRUE(line.Apply(Step(7, 101), now));
  EXPECT_THAT(line.Render(200), HasSubstr("step 101/400"));
  EXPECT_TRUE(line.Apply(Step(8, 50), now));  // a retry from an earlier checkpoint
  EXPECT_THAT(line.Render(200), HasSubstr("step 101/400"));
  EXPECT_TRUE(line.Apply(State(9, v1::Job::SUCCEEDED), now));
  EXPECT_EQ(line.state(), v1::Job::SUCCEEDED);
}

}  // namespace
}  // namespace oomb::client
