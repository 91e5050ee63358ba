#include <unistd.h>

#include <iostream>

#include <fmt/format.h>

#include "client/commands.h"
#include "client/progress.h"

namespace oomb::client {
namespace {

// `line` cut to fit `columns` ("..." at the end), at a UTF-8 character's start: a line that
// wrapped above the live progress line would leave its remainder behind at the next redraw.
// The whole text is in `oomb logs` and `oomb events`.
std::string FitTo(std::string line, int columns) {
  if (columns < 8 || static_cast<int>(line.size()) < columns) return line;
  size_t cut = static_cast<size_t>(columns - 4);
  while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0) == 0x80) --cut;
  line.resize(cut);
  return line + "...";
}

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

namespace {

// "TIME LEVEL message"; empty for a step, which is progress, not a log line.
std::string LogLine(const v1::JobEvent& e) {
  const char* level = "info";
  std::string text = e.message();
  switch (e.type()) {
    case v1::JobEvent::STEP:
      return "";
    case v1::JobEvent::WARNING:
      level = "warn";
      break;
    case v1::JobEvent::STATE_CHANGED:
      level = e.state() == v1::Job::FAILED ? "error" : "info";
      text = fmt::format("state {}{}", v1::Job::State_Name(e.state()), text.empty() ? "" : ": " + text);
      break;
    default:
      break;
  }
  if (!e.actor().empty()) text += " (by " + Printable(e.actor()) + ")";
  return fmt::format("{} {:<5} {}", Time(e.time()), level, Printable(text));
}

void PrintLog(const Globals& g, const v1::JobEvent& e) {
  if (e.type() == v1::JobEvent::STEP) return;
  if (g.output == "json") {
    std::cout << ToJson(e, false) << std::endl;
  } else {
    std::cout << LogLine(e) << std::endl;
  }
}

}  // namespace

grpc::Status ReadAllEvents(Client& c, const std::string& name, std::vector<v1::JobEvent>* out) {
  int64_t after = 0;
  for (;;) {
    v1::ListJobEventsRequest req;
    req.set_name(name);
    req.set_after_sequence(after);
    v1::ListJobEventsResponse resp;
    const grpc::Status s = c.Call(&v1::JobService::Stub::ListJobEvents, req, &resp);
    if (!s.ok()) return s;
    for (v1::JobEvent& e : *resp.mutable_events()) out->push_back(std::move(e));
    if (!out->empty()) after = out->back().sequence();
    if (!resp.more() || resp.events().empty()) return grpc::Status::OK;
  }
}

int Logs(Client& c, const std::string& name, bool follow) {
  std::vector<v1::JobEvent> stored;
  if (const grpc::Status s = ReadAllEvents(c, name, &stored); !s.ok()) return Fail(s);
  for (const v1::JobEvent& e : stored) PrintLog(c.globals(), e);
  const int64_t after = stored.empty() ? 0 : stored.back().sequence();
  if (!follow) return kOk;
  v1::WatchJobRequest req;
  req.set_name(name);
  req.set_after_sequence(after);
  auto ctx = c.Context(/*unary=*/false);
  auto reader = c.jobs().WatchJob(ctx.get(), req);
  v1::WatchJobResponse r;
  v1::Job::State state = v1::Job::STATE_UNSPECIFIED;
  std::string failure;
  while (reader->Read(&r)) {
    if (r.has_snapshot()) {
      state = r.snapshot().state();
      if (r.snapshot().has_error()) failure = r.snapshot().error().message();
      continue;
    }
    const v1::JobEvent& e = r.event();
    if (e.type() == v1::JobEvent::STATE_CHANGED) state = e.state();
    if (e.has_error()) failure = e.error().message();
    PrintLog(c.globals(), e);
  }
  const grpc::Status s = reader->Finish();
  if (!s.ok()) return Fail(s);
  return Outcome(name, state, failure);
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
      if (live && e.type() != v1::JobEvent::STEP) {
        std::cerr << "\r\033[K" << FitTo(EventLine(e), TerminalColumns()) << "\n";
      }
    }
    if (live) std::cerr << "\r\033[K" << line.Render(TerminalColumns()) << std::flush;
  }
  if (live) std::cerr << "\n";
  const grpc::Status s = reader->Finish();
  if (!s.ok()) return Fail(s);
  return Outcome(name, line.state(), failure);
}

}  // namespace oomb::client
