#include <unistd.h>

#include <iostream>

#include <fmt/format.h>

#include "client/commands.h"
#include "client/progress.h"

namespace oomb::client {
namespace {

// The exit code of a job that ended in `state`, with `failure` its error.
int Outcome(const std::string& name, v1::Job::State state, const std::string& failure) {
  if (state == v1::Job::FAILED) {
    std::cerr << "oomb: " << name << " FAILED" << (failure.empty() ? "" : ": " + failure) << "\n";
    return kJobFailed;
  }
  if (state == v1::Job::CANCELLED) {
    std::cerr << "oomb: " << name << " was CANCELLED\n";
    return kJobCancelled;
  }
  return kOk;
}

}  // namespace

std::string EventLine(const v1::JobEvent& e) {
  std::string what;
  switch (e.type()) {
    case v1::JobEvent::STATE_CHANGED:
      what = fmt::format("state {}{}", v1::Job::State_Name(e.state()), e.message().empty() ? "" : ": " + e.message());
      break;
    case v1::JobEvent::STEP:
      if (e.progress().total_steps() == 0) {  // method.type evaluate: its one report, no step
        what = "evaluated:";
        if (e.progress().eval_loss() > 0) what += fmt::format(" validation loss {:.4f}", e.progress().eval_loss());
        if (e.progress().has_evaluation()) what += " " + EvaluationLine(e.progress().evaluation());
        break;
      }
      what =
          fmt::format("step {}/{} loss {:.4f} lr {:.3g} {:.0f} tok/s", e.progress().step(), e.progress().total_steps(),
                      e.progress().loss(), e.progress().learning_rate(), e.progress().tokens_per_second());
      break;
    case v1::JobEvent::CHECKPOINT_SAVED:
      what = fmt::format("checkpoint step {} {} ({})", e.checkpoint().step(), e.checkpoint().path(),
                         Bytes(e.checkpoint().bytes()));
      break;
    case v1::JobEvent::WARNING:
      what = "warning: " + e.message();
      break;
    default:
      what = e.message();
  }
  if (!e.actor().empty()) what += " (by " + Printable(e.actor()) + ")";
  return fmt::format("{:>5} {} {}", e.sequence(), Time(e.time()), what);
}

int Watch(Client& c, const std::string& name, int64_t after) {
  v1::WatchJobRequest req;
  req.set_name(name);
  req.set_after_sequence(after);
  auto ctx = c.Context(/*unary=*/false);
  auto reader = c.jobs().WatchJob(ctx.get(), req);
  const std::string& output = c.globals().output;
  const bool live = ::isatty(2) && output == "table";
  ProgressLine line(name.substr(name.rfind('/') + 1));  // the job id: room for the bar on a narrow terminal
  v1::WatchJobResponse r;
  std::string failure;
  while (reader->Read(&r)) {
    if (output == "json") std::cout << ToJson(r, false) << std::endl;
    if (r.has_snapshot()) {
      line.Snapshot(r.snapshot());
      if (r.snapshot().has_error()) failure = r.snapshot().error().message();
    } else {
      const v1::JobEvent& e = r.event();
      line.Apply(e, ProgressLine::Clock::now());
      if (e.has_error()) failure = e.error().message();
      if (output == "table" && !live) std::cout << EventLine(e) << std::endl;
      if (live && e.type() != v1::JobEvent::STEP) std::cerr << "\r\033[K" << EventLine(e) << "\n";
    }
    if (live) std::cerr << "\r\033[K" << line.Render(TerminalColumns()) << std::flush;
  }
  if (live) std::cerr << "\n";
  const grpc::Status s = reader->Finish();
  if (!s.ok()) return Fail(s);
  return Outcome(name, line.state(), failure);
}

}  // namespace oomb::client
