// The scheduler's state machine with a ScriptedRunner in place of the trainer (it emits a few
// steps and a checkpoint; it tests the service, not training), and the JobService over a real
// in-process gRPC server on port 0. The job store's own contract: job_store_conformance_test.cc.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "server/job_service.h"
#include "server/job_spec.h"
#include "server/scheduler.h"
#include "server/store/job_store.h"
#include "server/watch_hub.h"
#include "tests/server/submit.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

using ::testing::HasSubstr;

// Emits `steps` steps (checking poll_stop before each), a checkpoint after step 2, then
// succeeds; or returns the scripted error.
struct ScriptedRunner {
  int steps = 3;
  absl::Status error;  // returned instead of succeeding when not OK
  std::atomic<int> calls{0};
  std::atomic<bool> last_resume{false};
  std::atomic<int> step_delay_ms{0};
  // Steps on through a pause request, as a run inside a long chunk would (a cancel still stops
  // it at the next step).
  std::atomic<bool> ignore_pause{false};
  std::atomic<int> active{0};  // runs in progress
  // Devices of the runs in the order they started, and the most devices in use at once.
  absl::Mutex mu;
  std::vector<std::pair<std::string, std::vector<std::string>>> runs;
  int devices_in_use = 0, max_devices_in_use = 0;

  absl::StatusOr<RunResult> operator()(const JobConfig& job, const RunOptions& o) {
    ++calls;
    last_resume = o.resume;
    {
      absl::MutexLock lock(&mu);
      runs.emplace_back(job.display_name, o.devices);
      devices_in_use += static_cast<int>(o.devices.size());
      max_devices_in_use = std::max(max_devices_in_use, devices_in_use);
    }
    ++active;
    absl::StatusOr<RunResult> r = Script(o);
    --active;
    absl::MutexLock lock(&mu);
    devices_in_use -= static_cast<int>(o.devices.size());
    return r;
  }

  absl::StatusOr<RunResult> Script(const RunOptions& o) {
    for (int s = 1; s <= steps; ++s) {
      const StopRequest stop = o.poll_stop();
      if (stop == StopRequest::kCancel) return RunResult{.outcome = RunOutcome::kCancelled, .final_checkpoint = {}};
      if ((stop == StopRequest::kPause && !ignore_pause) || stop == StopRequest::kPauseAtStepEnd) {
        o.on_checkpoint(
            CheckpointInfo{.step = s - 1, .path = o.checkpoint_dir->PathOf("pause"), .bytes = 1, .final = false});
        return RunResult{.outcome = RunOutcome::kPaused, .final_checkpoint = {}};
      }
      if (step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms.load()));
      o.on_step(StepReport{.step = s, .total_steps = steps, .tokens = 100 * s, .loss = 2.0 / s});
      if (s == 2) o.on_checkpoint(CheckpointInfo{.step = 2, .path = o.checkpoint_dir->PathOf("step-2"), .bytes = 10});
    }
    if (!error.ok()) return error;
    o.on_warning("scripted warning");
    return RunResult{
        .outcome = RunOutcome::kSucceeded,
        .final_checkpoint = {.step = steps, .path = o.checkpoint_dir->PathOf("final"), .bytes = 10, .final = true}};
  }
};

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("oomb_scheduler_test_" + std::to_string(::getpid()) + "_" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    auto s = OpenSqliteJobStore((dir_ / "oombd.db").string());
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    spec_.mutable_model()->set_path("/m");
    spec_.mutable_data()->set_train("/t");
  }
  void TearDown() override {
    scheduler_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  void StartScheduler(bool hold = false, std::vector<std::string> devices = {"cpu"},
                      const std::function<void(SchedulerOptions*)>& tweak = nullptr) {
    SchedulerOptions o;
    o.files = std::make_shared<const JobFiles>(JobFiles::Unconfined(dir_.string()));
    o.devices = std::move(devices);
    o.runner = [this](const JobConfig& s, const RunOptions& r) { return runner_(s, r); };
    o.hold = hold;
    if (tweak) tweak(&o);
    scheduler_ = std::make_unique<Scheduler>(store_.get(), &hub_, o);
    ASSERT_TRUE(scheduler_->Start().ok());
  }

  v1::Job WaitFor(const std::string& id, v1::Job::State state) {
    for (int i = 0; i < 500; ++i) {
      absl::StatusOr<v1::Job> j = store_->Get(id);
      if (j.ok() && j->state() == state) return *j;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << id << " never reached " << v1::Job::State_Name(state) << "; now "
                  << v1::Job::State_Name(store_->Get(id)->state());
    return v1::Job();
  }

  std::vector<v1::JobEvent> Events(const std::string& id) { return *store_->ListEvents(id, 0, 1000); }

  std::filesystem::path dir_;
  std::unique_ptr<JobStore> store_;
  WatchHub hub_;
  ScriptedRunner runner_;
  std::unique_ptr<Scheduler> scheduler_;
  v1::JobSpec spec_;
};

TEST_F(SchedulerTest, RunsToSuccessWithStepsAndCheckpoints) {
  StartScheduler();
  absl::StatusOr<v1::Job> job = SubmitSpec(*scheduler_, spec_, "a", "");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->name(), "projects/default/jobs/a");
  const v1::Job done = WaitFor("a", v1::Job::SUCCEEDED);
  EXPECT_EQ(done.progress().step(), 3);
  EXPECT_EQ(done.attempt(), 1);
  EXPECT_TRUE(done.has_end_time());
  EXPECT_EQ(done.checkpoint_dir(), (dir_ / "jobs/a/checkpoints").string());
  const std::vector<v1::JobEvent> events = Events("a");
  std::vector<int> types;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].sequence(), static_cast<int64_t>(i + 1));  // per job, from 1, no gaps
    types.push_back(events[i].type());
  }
  using E = v1::JobEvent;
  EXPECT_THAT(types, ::testing::ElementsAre(E::STATE_CHANGED, E::STATE_CHANGED, E::STEP, E::STEP, E::CHECKPOINT_SAVED,
                                            E::STEP, E::WARNING, E::STATE_CHANGED));
  EXPECT_EQ(events.back().state(), v1::Job::SUCCEEDED);
  EXPECT_EQ(store_->ListCheckpoints("a")->size(), 1u);
  EXPECT_FALSE(runner_.last_resume);
}

// resources.gpus = 2 takes both devices at once; the queue's head waits for them (a later
// one-device job does not overtake it); a job asking for more devices than exist is refused.
TEST_F(SchedulerTest, DataParallelJobTakesItsDevicesTogether) {
  runner_.step_delay_ms = 100;
  StartScheduler(/*hold=*/false, {"cpu", "cpu"});
  v1::JobSpec three = spec_;
  three.mutable_resources()->set_gpus(3);
  three.mutable_training()->set_batch_sequences(3);
  EXPECT_THAT(std::string(scheduler_->CheckPlacement(*ResolveJobSpec(three)).message()),
              HasSubstr("resources.gpus: 3 devices asked for, but 2 of this server's may run the job"));
  v1::JobSpec one = spec_, dp = spec_, later = spec_;
  one.set_display_name("one");
  dp.set_display_name("dp");
  dp.mutable_resources()->set_gpus(2);
  dp.mutable_training()->set_batch_sequences(2);
  later.set_display_name("later");
  ASSERT_TRUE(SubmitSpec(*scheduler_, one, "one", "").ok());
  WaitFor("one", v1::Job::RUNNING);
  ASSERT_TRUE(SubmitSpec(*scheduler_, dp, "dp", "").ok());
  ASSERT_TRUE(SubmitSpec(*scheduler_, later, "later", "").ok());
  for (const char* id : {"one", "dp", "later"}) WaitFor(id, v1::Job::SUCCEEDED);
  absl::MutexLock lock(&runner_.mu);
  ASSERT_EQ(runner_.runs.size(), 3u);
  EXPECT_EQ(runner_.runs[0].first, "one");
  EXPECT_EQ(runner_.runs[1].first, "dp");
  EXPECT_THAT(runner_.runs[1].second, ::testing::ElementsAre("cpu", "cpu"));
  EXPECT_EQ(runner_.runs[2].first, "later");
  EXPECT_EQ(runner_.max_devices_in_use, 2);
  bool said = false;
  for (const v1::JobEvent& e : Events("dp")) said |= e.message().find("running on cpu,cpu") != std::string::npos;
  EXPECT_TRUE(said);
}

TEST_F(SchedulerTest, IdempotentCreateAndAlreadyExists) {
  StartScheduler(/*hold=*/true);
  bool created = false;
  absl::StatusOr<v1::Job> a = SubmitSpec(*scheduler_, spec_, "", "req-1", &created);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(created);
  absl::StatusOr<v1::Job> b = SubmitSpec(*scheduler_, spec_, "", "req-1", &created);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(created);
  EXPECT_EQ(a->name(), b->name());
  ASSERT_TRUE(SubmitSpec(*scheduler_, spec_, "x", "").ok());
  EXPECT_EQ(SubmitSpec(*scheduler_, spec_, "x", "").status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(SchedulerTest, QueueOrderAndTransitions) {
  StartScheduler(/*hold=*/true);
  v1::JobSpec high = spec_;
  high.mutable_resources()->set_priority(5);
  ASSERT_TRUE(SubmitSpec(*scheduler_, spec_, "low", "").ok());
  ASSERT_TRUE(SubmitSpec(*scheduler_, high, "high", "").ok());
  v1::Job low = *store_->Get("low");
  scheduler_->FillQueueState(&low);
  EXPECT_EQ(low.queue_position(), 2);
  // Illegal transitions are FAILED_PRECONDITION naming the state.
  EXPECT_EQ(scheduler_->Resume("low").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(scheduler_->Delete("low").message(), HasSubstr("it is QUEUED"));
  ASSERT_EQ(scheduler_->Pause("low")->state(), v1::Job::PAUSED);
  EXPECT_EQ(scheduler_->Pause("low").status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(scheduler_->Resume("low")->state(), v1::Job::QUEUED);
  ASSERT_EQ(scheduler_->Cancel("low")->state(), v1::Job::CANCELLED);
  EXPECT_EQ(scheduler_->Cancel("low").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(scheduler_->Delete("low").ok());
  EXPECT_EQ(store_->Get("low").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(scheduler_->Cancel("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, CancelAndPauseWhileRunning) {
  runner_.steps = 1000;
  runner_.step_delay_ms = 5;
  StartScheduler();
  ASSERT_TRUE(SubmitSpec(*scheduler_, spec_, "c", "").ok());
  WaitFor("c", v1::Job::RUNNING);
  ASSERT_EQ(scheduler_->Cancel("c")->state(), v1::Job::CANCELLING);
  WaitFor("c", v1::Job::CANCELLED);

  ASSERT_TRUE(SubmitSpec(*scheduler_, spec_, "p", "").ok());
  WaitFor("p", v1::Job::RUNNING);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ASSERT_EQ(scheduler_->Pause("p")->state(), v1::Job::PAUSING);
  WaitFor("p", v1::Job::PAUSED);
  runner_.steps = 2;
  runner_.step_delay_ms = 0;
  ASSERT_TRUE(scheduler_->Resume("p").ok());
  const v1::Job done = WaitFor("p", v1::Job::SUCCEEDED);
  EXPECT_TRUE(runner_.last_resume);  // the pause checkpoint is resumed from
  EXPECT_EQ(done.attempt(), 2);
}

TEST_F(SchedulerTest, RetriesTransientErrorsThenFails) {
  runner_.error = oomb::WithReason(absl::InternalError("device fell off the bus"), oomb::Reason::kCudaError);
  spec_.mutable_resources()->set_max_retries(1);
  StartScheduler();
  ASSERT_TRUE(SubmitSpec(*scheduler_, spec_, "r", "").ok());
  const v1::Job failed = WaitFor("r", v1::Job::FAILED);
  EXPECT_EQ(runner_.calls.load(), 2);
  EXPECT_EQ(failed.retries(), 1);
  EXPECT_EQ(failed.error().code(), "INTERNAL");
  EXPECT_EQ(failed.error().reason(), "CUDA_ERROR");
  EXPECT_TRUE(runner_.last_resume);  // the retry resumed from the step-2 checkpoint
}

TEST_F(SchedulerTest, NonTransientErrorFailsAtOnce) {
  runner_.error = oomb::WithReason(absl::InternalError("loss is nan at step 3"), oomb::Reason::kNanLoss);
  StartScheduler();
  ASSERT_TRUE(SubmitSpec(*scheduler_, spec_, "n", "").ok());
  const v1::Job failed = WaitFor("n", v1::Job::FAILED);
  EXPECT_EQ(runner_.calls.load(), 1);
  EXPECT_EQ(failed.error().reason(), "NAN_LOSS");
}

// A run that has not stopped by the drain's deadline is told to stop without a checkpoint, and
// Drain returns only once it has (no thread is left behind); the job is QUEUED to resume from
// its last checkpoint, and says why.
TEST_F(SchedulerTest, DrainPastItsDeadlineStopsTheRunAndWaitsForIt) {
  runner_.steps = 100000;
  runner_.step_delay_ms = 5;
  runner_.ignore_pause = true;
  StartScheduler();
  ASSERT_TRUE(SubmitSpec(*scheduler_, spec_, "slow", "").ok());
  WaitFor("slow", v1::Job::RUNNING);
  EXPECT_FALSE(scheduler_->Drain(absl::Milliseconds(200)));
  EXPECT_EQ(runner_.active.load(), 0) << "Drain returned while the run was still going";
  const absl::StatusOr<v1::Job> job = store_->Get("slow");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::Job::QUEUED);
  const std::vector<v1::JobEvent> events = Events("slow");
  ASSERT_FALSE(events.empty());
  EXPECT_THAT(events.back().message(), HasSubstr("before it could checkpoint"));
}

TEST_F(SchedulerTest, DrainLeavesRunningJobQueuedAndRestartRecovers) {
  runner_.steps = 1000;
  runner_.step_delay_ms = 5;
  StartScheduler();
  ASSERT_TRUE(SubmitSpec(*scheduler_, spec_, "d", "").ok());
  WaitFor("d", v1::Job::RUNNING);
  EXPECT_TRUE(scheduler_->Drain(absl::Seconds(10)));
  EXPECT_EQ(store_->Get("d")->state(), v1::Job::QUEUED);
  EXPECT_EQ(SubmitSpec(*scheduler_, spec_, "late", "").status().code(), absl::StatusCode::kUnavailable);
  scheduler_.reset();

  // A job the previous process left RUNNING (a crash) goes RECOVERING -> QUEUED -> runs.
  ASSERT_TRUE(store_
                  ->Update("d",
                           [](v1::Job* j, std::vector<v1::JobEvent>*) {
                             j->set_state(v1::Job::RUNNING);
                             return absl::OkStatus();
                           })
                  .ok());
  runner_.steps = 2;
  runner_.step_delay_ms = 0;
  StartScheduler();
  WaitFor("d", v1::Job::SUCCEEDED);
  EXPECT_TRUE(runner_.last_resume);
  bool saw_recovering = false;
  for (const v1::JobEvent& e : Events("d")) saw_recovering |= e.state() == v1::Job::RECOVERING;
  EXPECT_TRUE(saw_recovering);
}

// Preemption (scheduler.h): a waiting job of higher priority takes the device of the running job
// of lower priority, which finishes its step, checkpoints it and is requeued to resume; a job of
// another project does not preempt unless the scope is every project; nobody is preempted within
// the minimum run time.
class PreemptionTest : public SchedulerTest {
 protected:
  void Start(PreemptionScope scope, absl::Duration min_run) {
    runner_.steps = 100000;
    runner_.step_delay_ms = 5;
    StartScheduler(/*hold=*/false, {"cpu"}, [&](SchedulerOptions* o) {
      o->preemption = scope;
      o->preemption_min_run = min_run;
      o->heartbeat = absl::Milliseconds(100);
      o->lease = absl::Seconds(2);
    });
  }
  absl::StatusOr<v1::Job> Submit(const std::string& id, int priority, const std::string& project = "default") {
    v1::JobSpec s = spec_;
    s.mutable_resources()->set_priority(priority);
    SubmitOptions o;
    o.project = project;
    o.creator = "user-" + id;
    return SubmitSpec(*scheduler_, s, id, "", nullptr, o);
  }
  bool Said(const std::string& id, const std::string& text) {
    for (const v1::JobEvent& e : Events(id)) {
      if (e.message().find(text) != std::string::npos) return true;
    }
    return false;
  }
};

TEST_F(PreemptionTest, AHigherPriorityJobPreemptsTheRunningOneWhichResumesAfterIt) {
  Start(PreemptionScope::kProject, absl::ZeroDuration());
  ASSERT_TRUE(Submit("low", 0).ok());
  WaitFor("low", v1::Job::RUNNING);
  ASSERT_TRUE(Submit("high", 5).ok());
  WaitFor("high", v1::Job::RUNNING);
  const v1::Job low = *store_->Get("low");
  EXPECT_EQ(low.state(), v1::Job::QUEUED);
  EXPECT_EQ(low.preempted_by(), "projects/default/jobs/high");
  EXPECT_TRUE(Said("low", "preempting: projects/default/jobs/high (priority 5)"));
  EXPECT_TRUE(Said("low", "preempted by projects/default/jobs/high; queued to resume from its checkpoint"));
  bool by_creator = false;
  for (const v1::JobEvent& e : Events("low")) by_creator |= e.state() == v1::Job::PAUSING && e.actor() == "user-high";
  EXPECT_TRUE(by_creator) << "the preemption's event names the preempting job's creator";
  ASSERT_FALSE(store_->ListCheckpoints("low")->empty()) << "the preempted job checkpointed";
  // When high ends, low runs again from its checkpoint, no longer marked preempted.
  ASSERT_TRUE(scheduler_->Cancel("high").ok());
  const v1::Job again = WaitFor("low", v1::Job::RUNNING);
  EXPECT_TRUE(again.preempted_by().empty());
  EXPECT_EQ(again.attempt(), 2);
  EXPECT_TRUE(runner_.last_resume);
  ASSERT_TRUE(scheduler_->Cancel("low").ok());
  WaitFor("low", v1::Job::CANCELLED);
}

TEST_F(PreemptionTest, TheScopeDecidesWhoseJobsMayBePreempted) {
  Start(PreemptionScope::kProject, absl::ZeroDuration());
  ASSERT_TRUE(Submit("theirs", 0, "vision").ok());
  WaitFor("theirs", v1::Job::RUNNING);
  ASSERT_TRUE(Submit("mine", 9, "nlp").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // heartbeats come and go
  EXPECT_EQ(store_->Get("theirs")->state(), v1::Job::RUNNING);
  v1::Job mine = *store_->Get("mine");
  scheduler_->FillQueueState(&mine);
  EXPECT_EQ(mine.waiting_reason(), "next in the queue; waiting for 1 idle device");
  ASSERT_TRUE(scheduler_->Cancel("mine").ok());
  ASSERT_TRUE(scheduler_->Cancel("theirs").ok());
  WaitFor("theirs", v1::Job::CANCELLED);
  scheduler_.reset();
  Start(PreemptionScope::kAll, absl::ZeroDuration());
  ASSERT_TRUE(Submit("theirs-2", 0, "vision").ok());
  WaitFor("theirs-2", v1::Job::RUNNING);
  ASSERT_TRUE(Submit("mine-2", 9, "nlp").ok());
  WaitFor("mine-2", v1::Job::RUNNING);
  EXPECT_EQ(store_->Get("theirs-2")->preempted_by(), "projects/nlp/jobs/mine-2");
  ASSERT_TRUE(scheduler_->Cancel("mine-2").ok());
  ASSERT_TRUE(scheduler_->Cancel("theirs-2").ok());
}

// Issue 78: a project the operator bars from preempting others (preempt_other_projects: false)
// waits under scope all, as under scope project.
TEST_F(PreemptionTest, AProjectBarredFromPreemptingOthersWaitsUnderScopeAll) {
  const std::string path = ::testing::TempDir() + "/oomb_projects_" + std::to_string(::getpid()) + ".yaml";
  std::ofstream(path) << "projects:\n  nlp: {preempt_other_projects: false}\n";
  absl::StatusOr<std::shared_ptr<const ProjectRegistry>> projects = ProjectRegistry::Create(path);
  ASSERT_TRUE(projects.ok()) << projects.status();
  runner_.steps = 100000;
  runner_.step_delay_ms = 5;
  StartScheduler(/*hold=*/false, {"cpu"}, [&](SchedulerOptions* o) {
    o->preemption = PreemptionScope::kAll;
    o->preemption_min_run = absl::ZeroDuration();
    o->heartbeat = absl::Milliseconds(100);
    o->lease = absl::Seconds(2);
    o->projects = *projects;
  });
  ASSERT_TRUE(Submit("theirs", 0, "vision").ok());
  WaitFor("theirs", v1::Job::RUNNING);
  ASSERT_TRUE(Submit("mine", 9, "nlp").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // heartbeats come and go
  EXPECT_EQ(store_->Get("theirs")->state(), v1::Job::RUNNING);
  EXPECT_EQ(store_->Get("mine")->state(), v1::Job::QUEUED);
  ASSERT_TRUE(scheduler_->Cancel("mine").ok());
  ASSERT_TRUE(scheduler_->Cancel("theirs").ok());
  WaitFor("theirs", v1::Job::CANCELLED);
  std::remove(path.c_str());
}

TEST_F(PreemptionTest, NoJobIsPreemptedWithinTheMinimumRunTimeNorForEqualPriority) {
  Start(PreemptionScope::kProject, absl::Milliseconds(1500));
  ASSERT_TRUE(Submit("first", 0).ok());
  WaitFor("first", v1::Job::RUNNING);
  const absl::Time started = absl::Now();
  ASSERT_TRUE(Submit("same", 0).ok());  // equal priority: waits its turn
  ASSERT_TRUE(Submit("urgent", 3).ok());
  WaitFor("urgent", v1::Job::RUNNING);  // after the minimum run, at a heartbeat
  EXPECT_GE(absl::Now() - started, absl::Milliseconds(1400));
  EXPECT_EQ(store_->Get("first")->preempted_by(), "projects/default/jobs/urgent");
  EXPECT_EQ(store_->Get("same")->state(), v1::Job::QUEUED);
  for (const char* id : {"urgent", "first", "same"}) ASSERT_TRUE(scheduler_->Cancel(id).ok());
}

// Quotas (projects file): a project at its max_running_devices waits with the reason, another
// project's job takes the free device; a job asking for more than the quota is refused.
TEST_F(SchedulerTest, AProjectAtItsDeviceQuotaWaitsAndOthersRun) {
  const std::filesystem::path file = dir_ / "projects.yaml";
  std::ofstream(file) << "projects:\n  nlp: {max_running_devices: 1}\n  vision: {}\n";
  absl::StatusOr<std::shared_ptr<const ProjectRegistry>> projects = ProjectRegistry::Create(file.string());
  ASSERT_TRUE(projects.ok()) << projects.status();
  runner_.steps = 100000;
  runner_.step_delay_ms = 5;
  StartScheduler(/*hold=*/false, {"cpu", "cpu"}, [&](SchedulerOptions* o) { o->projects = *projects; });
  const auto submit = [&](const std::string& id, const std::string& project, int gpus = 1) {
    v1::JobSpec s = spec_;
    s.mutable_resources()->set_gpus(gpus);
    s.mutable_training()->set_batch_sequences(gpus);
    SubmitOptions o;
    o.project = project;
    return SubmitSpec(*scheduler_, s, id, "", nullptr, o);
  };
  ASSERT_TRUE(submit("n1", "nlp").ok());
  WaitFor("n1", v1::Job::RUNNING);
  ASSERT_TRUE(submit("n2", "nlp").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  v1::Job n2 = *store_->Get("n2");
  EXPECT_EQ(n2.state(), v1::Job::QUEUED);
  scheduler_->FillQueueState(&n2);
  EXPECT_EQ(n2.waiting_reason(), "project nlp uses 1/1 devices");
  ASSERT_TRUE(submit("v1", "vision").ok());
  WaitFor("v1", v1::Job::RUNNING);
  const absl::StatusOr<v1::Job> two = submit("n3", "nlp", 2);
  EXPECT_EQ(two.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(two.status().message(), HasSubstr("project nlp may hold at most 1 at once"));
  // n1 ends: n2 takes the device (the quota released).
  ASSERT_TRUE(scheduler_->Cancel("n1").ok());
  WaitFor("n2", v1::Job::RUNNING);
  for (const char* id : {"n2", "v1"}) ASSERT_TRUE(scheduler_->Cancel(id).ok());
}

TEST_F(SchedulerTest, PlacementChecksDevice) {
  StartScheduler(/*hold=*/true);
  v1::JobSpec s = spec_;
  s.mutable_resources()->set_device("cuda:1");
  EXPECT_THAT(scheduler_->CheckPlacement(*ResolveJobSpec(s)).message(),
              HasSubstr("resources.device: 'cuda:1' is not available"));
  s.mutable_resources()->set_device("cpu");
  EXPECT_TRUE(scheduler_->CheckPlacement(*ResolveJobSpec(s)).ok());
}

}  // namespace
}  // namespace oomb::server
