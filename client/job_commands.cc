// The job subcommands: submit, list, get, watch, events, logs, plot, cancel, pause, resume,
// delete, checkpoints.
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "client/commands.h"
#include "client/plot.h"

namespace oomb::client {
namespace {

void PrintJobTable(const std::vector<const v1::Job*>& jobs) {
  std::cout << fmt::format("{:<24} {:<12} {:>13} {:>8} {:<19} {}\n", "NAME", "STATE", "STEP", "LOSS", "CREATED",
                           "DISPLAY_NAME");
  for (const v1::Job* j : jobs) {
    const std::string state = StateName(j->state());
    const int pad = 12 + static_cast<int>(state.size() - v1::Job::State_Name(j->state()).size());
    std::cout << fmt::format("{:<24} {:<{}} {:>13} {:>8} {:<19} {}\n", j->name(), state, pad,
                             j->spec().method().type() == v1::Method::evaluate
                                 ? "evaluate"
                                 : fmt::format("{}/{}", j->progress().step(), j->progress().total_steps()),
                             j->progress().step() > 0 ? fmt::format("{:.4f}", j->progress().loss()) : "-",
                             Time(j->create_time()), Printable(j->spec().display_name()));
  }
}

void PrintJobDetail(const v1::Job& j) {
  std::cout << fmt::format("name:        {}\n", j.name());
  std::cout << fmt::format("state:       {}\n", StateName(j.state()));
  if (j.queue_position() > 0) std::cout << fmt::format("queue:       position {}\n", j.queue_position());
  if (!j.waiting_reason().empty()) std::cout << fmt::format("waiting:     {}\n", Printable(j.waiting_reason()));
  if (!j.preempted_by().empty()) std::cout << fmt::format("preempted:   by {}\n", j.preempted_by());
  if (!j.mlflow_run().empty()) std::cout << fmt::format("mlflow:      {}\n", Printable(j.mlflow_run()));
  if (!j.daemon().empty()) std::cout << fmt::format("daemon:      {}\n", j.daemon());
  if (!j.spec().display_name().empty())
    std::cout << fmt::format("display:     {}\n", Printable(j.spec().display_name()));
  std::cout << fmt::format("model:       {}\n", j.spec().model().path());
  const v1::MethodSpec& method = j.spec().method();
  if (method.type() == v1::Method::evaluate) {  // no training: what is evaluated, and its loss
    const std::string& adapter = method.lora().init_adapter();
    std::cout << fmt::format("method:      evaluate ({})\n", adapter.empty() ? "the base model" : "adapter " + adapter);
    if (!j.spec().data().validation().empty()) {
      std::cout << fmt::format("validation:  {}\n", j.spec().data().validation());
    }
    if (j.progress().eval_loss() > 0) std::cout << fmt::format("eval loss:   {:.4f}\n", j.progress().eval_loss());
  } else {
    std::cout << fmt::format("data:        {}\n", j.spec().data().train());
    std::cout << fmt::format("progress:    step {}/{}, {} tokens, loss {:.4f}\n", j.progress().step(),
                             j.progress().total_steps(), j.progress().tokens(), j.progress().loss());
    if (j.progress().step_seconds() > 0) {
      std::cout << fmt::format(
          "last step:   {:.3g} s, {:.0f} tok/s{}\n", j.progress().step_seconds(), j.progress().tokens_per_second(),
          j.progress().mfu() > 0 ? fmt::format(", {:.1f}% MFU (datasheet peak)", 100 * j.progress().mfu()) : "");
    }
    if (j.progress().router_aux_loss() > 0) {
      std::cout << fmt::format("router aux:  {:.4f} (the router's load-balancing loss, not weighted)\n",
                               j.progress().router_aux_loss());
    }
  }
  if (j.progress().has_evaluation()) {
    std::cout << fmt::format("evaluation:  {}\n", EvaluationLine(j.progress().evaluation()));
    for (const std::string& line : RulerLines(j.progress().evaluation())) {
      std::cout << fmt::format("  ruler:     {}\n", line);
    }
  }
  std::cout << fmt::format("attempt:     {} (retries {})\n", j.attempt(), j.retries());
  std::cout << fmt::format("created:     {}\n", Time(j.create_time()));
  std::cout << fmt::format("started:     {}\n", Time(j.start_time()));
  std::cout << fmt::format("ended:       {}\n", Time(j.end_time()));
  std::cout << fmt::format("checkpoints: {}\n", j.checkpoint_dir());
  for (const std::string& w : j.warnings()) std::cout << fmt::format("warning: {}\n", w);
  if (j.has_error()) {
    std::cout << fmt::format("error:       {} {}: {}\n", j.error().code(), j.error().reason(), j.error().message());
  }
}

// "loss:        ▇▆▅▄▃▂▁  3.1200 → 1.0500 (steps 1-40)", from the job's STEP events; nothing when
// they cannot be read (the rest of `get` was printed).
void PrintLossSparkline(Client& client, const std::string& name) {
  std::vector<v1::JobEvent> events;
  if (!ReadAllEvents(client, name, &events).ok()) return;
  const JobCurves c = CurvesFromEvents(events);
  if (c.loss.empty()) return;
  std::cout << fmt::format("loss:        {}  {:.4f} → {:.4f} (steps {:.0f}-{:.0f})\n", Sparkline(c.loss, 40),
                           c.loss.front(), c.loss.back(), c.step.front(), c.step.back());
}

// A subcommand taking one JOB argument; `job` receives it.
CLI::App* JobCommand(CLI::App& app, const char* name, const char* help, const std::string& footer,
                     std::shared_ptr<std::string> job) {
  CLI::App* cmd = app.add_subcommand(name, help)->footer(footer);
  cmd->add_option("job", *job, "Job id or jobs/{id}")->required();
  return cmd;
}

// A random idempotency key (128 bits, hex), so that a submit retried after a lost answer never
// creates a second job.
std::string NewRequestId() {
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 4; ++i) id += fmt::format("{:08x}", rd());
  return id;
}

// CreateJob, retried with the same request_id while the server is unavailable or the answer did
// not come in time (3 tries, 1 s then 2 s apart): the job the first try may have created is the
// one returned, never a second.
grpc::Status CreateWithRetries(Client& client, const v1::CreateJobRequest& req, v1::Job* job) {
  constexpr int kTries = 3;
  for (int attempt = 1;; ++attempt) {
    const grpc::Status s = client.Call(&v1::JobService::Stub::CreateJob, req, job);
    const bool transient =
        s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (s.ok() || !transient || attempt == kTries) return s;
    std::cerr << "oomb: " << (s.error_code() == grpc::StatusCode::UNAVAILABLE ? "UNAVAILABLE" : "DEADLINE_EXCEEDED")
              << "; retrying with the same request id (" << attempt << "/" << kTries - 1 << ")\n";
    std::this_thread::sleep_for(std::chrono::seconds(attempt));
  }
}

void AddSubmit(CLI::App& app, const Cli& cli) {
  auto* submit = app.add_subcommand("submit", "Create a job from a YAML job spec (proto/oomb/v1/job_spec.proto)")
                     ->footer(
                         "Examples:\n  oomb submit job.yaml\n  oomb submit job.yaml --set training.max_steps=5 "
                         "--set labels.team=nlp --watch\n  oomb submit job.yaml --job-id austen-1 --request-id "
                         "$(uuidgen)");
  struct Args {
    std::string file, job_id, request_id;
    std::vector<std::string> sets;
    bool watch = false, validate_only = false;
  };
  auto a = std::make_shared<Args>();
  submit->add_option("file", a->file, "Job spec (YAML)")->required();
  submit->add_option("--set", a->sets, "Override a field: dotted.key=value (repeatable)");
  submit->add_option("--job-id", a->job_id, "Choose the job id ([a-z0-9][a-z0-9-]{0,62})");
  submit->add_option("--request-id", a->request_id,
                     "Idempotency key: a retried submit returns the same job (default: a random one, kept across "
                     "the CLI's own retries)");
  submit->add_flag("--validate-only", a->validate_only, "Check the spec on the server; create nothing");
  submit->add_flag("--watch", a->watch, "Watch the job after creating it (exit code follows the job)");
  OnRun(submit, [cli, a] {
    v1::CreateJobRequest req;
    if (int rc = LoadSpec(a->file, a->sets, req.mutable_spec()); rc) return rc;
    req.set_job_id(a->job_id);
    req.set_request_id(a->request_id.empty() ? NewRequestId() : a->request_id);
    req.set_parent(Parent(cli.globals));
    req.set_validate_only(a->validate_only);
    v1::Job job;
    const grpc::Status s = CreateWithRetries(cli.client(), req, &job);
    if (!s.ok()) return Fail(s);
    for (const std::string& w : job.warnings()) std::cerr << "warning: " << w << "\n";
    if (!PrintStructured(cli.globals, job)) {
      if (a->validate_only) {
        std::cout << "valid\n";
      } else {
        std::cout << job.name() << " " << StateName(job.state())
                  << (job.queue_position() ? fmt::format(" (queue position {})", job.queue_position()) : "") << "\n";
        if (!job.waiting_reason().empty()) std::cerr << "waiting: " << Printable(job.waiting_reason()) << "\n";
      }
    }
    if (a->watch && !a->validate_only) return Watch(cli.client(), job.name(), 0);
    return 0;
  });
}

// --state and --label filters into the request; kUsage (printed) for a bad one.
int ListFilters(const std::vector<std::string>& states, const std::vector<std::string>& labels,
                v1::ListJobsRequest* req) {
  for (const std::string& s : states) {
    v1::Job::State st;
    if (!v1::Job::State_Parse(s, &st)) {
      std::cerr << "oomb: error: --state: unknown state '" << s << "'\n";
      return kUsage;
    }
    req->add_states(st);
  }
  for (const std::string& l : labels) {
    const size_t eq = l.find('=');
    if (eq == std::string::npos) {
      std::cerr << "oomb: error: --label: expected k=v, got '" << l << "'\n";
      return kUsage;
    }
    (*req->mutable_labels())[l.substr(0, eq)] = l.substr(eq + 1);
  }
  return kOk;
}

void AddList(CLI::App& app, const Cli& cli) {
  auto* list = app.add_subcommand("list", "List jobs, newest first")
                   ->footer(
                       "Examples:\n  oomb list\n  oomb list --state RUNNING --state QUEUED --label team=nlp\n"
                       "  oomb list --page-size 10 -o json   # next_page_token in the output");
  struct Args {
    std::vector<std::string> states, labels;
    int page_size = 0;
    std::string page_token;
    bool all_projects = false;
  };
  auto a = std::make_shared<Args>();
  list->add_flag("-A,--all-projects", a->all_projects, "Jobs of every project you may act in (projects/-)");
  list->add_option("--state", a->states, "Only jobs in this state (repeatable)");
  list->add_option("--label", a->labels, "Only jobs with this label, k=v (repeatable)");
  list->add_option("--page-size", a->page_size, "Jobs per page (server default 50, max 1000)");
  list->add_option("--page-token", a->page_token, "Continue from a previous page's next_page_token");
  OnRun(list, [cli, a] {
    v1::ListJobsRequest req;
    if (int rc = ListFilters(a->states, a->labels, &req); rc) return rc;
    req.set_parent(a->all_projects ? "projects/-" : Parent(cli.globals));
    req.set_page_size(a->page_size);
    req.set_page_token(a->page_token);
    v1::ListJobsResponse resp;
    const grpc::Status s = cli.client().Call(&v1::JobService::Stub::ListJobs, req, &resp);
    if (!s.ok()) return Fail(s);
    if (!PrintStructured(cli.globals, resp)) {
      std::vector<const v1::Job*> jobs;
      for (const v1::Job& j : resp.jobs()) jobs.push_back(&j);
      PrintJobTable(jobs);
      if (!resp.next_page_token().empty()) std::cerr << "more: --page-token " << resp.next_page_token() << "\n";
    }
    return 0;
  });
}

void AddGet(CLI::App& app, const Cli& cli) {
  auto job = std::make_shared<std::string>();
  auto* get = JobCommand(app, "get", "Show one job",
                         "Examples:\n  oomb get job-abc123\n  oomb get jobs/job-abc123 -o yaml", job);
  OnRun(get, [cli, job] {
    v1::GetJobRequest req;
    req.set_name(JobName(cli.globals, *job));
    v1::Job out;
    const grpc::Status s = cli.client().Call(&v1::JobService::Stub::GetJob, req, &out);
    if (!s.ok()) return Fail(s);
    if (PrintStructured(cli.globals, out)) return 0;
    PrintJobDetail(out);
    if (out.progress().step() > 0) PrintLossSparkline(cli.client(), out.name());
    return 0;
  });
}

void AddPlot(CLI::App& app, const Cli& cli) {
  auto job = std::make_shared<std::string>();
  auto file = std::make_shared<std::string>();
  auto* plot = JobCommand(app, "plot",
                          "Draw a job's loss (and validation loss), learning rate, tokens/s and memory by step "
                          "as an SVG image",
                          "Examples:\n  oomb plot job-abc123 -o curves.svg\n"
                          "Open the SVG in a browser; cairosvg or Inkscape turn it into a PNG.",
                          job);
  plot->add_option("-o,--out", *file, "The SVG file to write (default: JOB.svg)");
  OnRun(plot, [cli, job, file] {
    const std::string name = JobName(cli.globals, *job);
    std::string path = *file;
    if (path.empty()) path = name.substr(name.rfind('/') + 1) + ".svg";
    if (path.size() < 4 || path.compare(path.size() - 4, 4, ".svg") != 0) {
      std::cerr << "oomb: plot: -o " << path << ": oomb plot writes SVG; name a .svg file\n";
      return static_cast<int>(kUsage);
    }
    std::vector<v1::JobEvent> events;
    const grpc::Status s = ReadAllEvents(cli.client(), name, &events);
    if (!s.ok()) return Fail(s);
    const JobCurves curves = CurvesFromEvents(events);
    if (curves.step.empty()) {
      std::cerr << "oomb: plot: " << name << " has no finished steps yet\n";
      return static_cast<int>(kError);
    }
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << PlotSvg(curves, name);
    out.close();
    if (!out) {
      std::cerr << "oomb: plot: cannot write " << path << ": " << std::strerror(errno) << "\n";
      return static_cast<int>(kError);
    }
    std::cout << path << "\n";
    return 0;
  });
}

void AddWatchAndEvents(CLI::App& app, const Cli& cli) {
  auto job = std::make_shared<std::string>();
  auto after = std::make_shared<int64_t>(0);
  auto* watch = JobCommand(app, "watch", "Follow a job until it ends (progress line on a terminal)",
                           "Examples:\n  oomb watch job-abc123\n  oomb watch job-abc123 --after 120 -o json\n"
                           "Exits 0 when the job SUCCEEDED, 6 when it FAILED, 7 when it was CANCELLED.",
                           job);
  watch->add_option("--after", *after, "Replay events after this sequence number");
  OnRun(watch, [cli, job, after] { return Watch(cli.client(), JobName(cli.globals, *job), *after); });

  auto ejob = std::make_shared<std::string>();
  auto eafter = std::make_shared<int64_t>(0);
  auto page = std::make_shared<int>(0);
  auto* events = JobCommand(app, "events", "List a job's events",
                            "Examples:\n  oomb events job-abc123\n  oomb events job-abc123 --after 10 -o json", ejob);
  events->add_option("--after", *eafter, "Only events after this sequence number");
  events->add_option("--page-size", *page, "Events per call (server default 500)");
  OnRun(events, [cli, ejob, eafter, page] {
    v1::ListJobEventsRequest req;
    req.set_name(JobName(cli.globals, *ejob));
    req.set_after_sequence(*eafter);
    req.set_page_size(*page);
    v1::ListJobEventsResponse resp;
    const grpc::Status s = cli.client().Call(&v1::JobService::Stub::ListJobEvents, req, &resp);
    if (!s.ok()) return Fail(s);
    if (!PrintStructured(cli.globals, resp)) {
      for (const v1::JobEvent& e : resp.events()) std::cout << EventLine(e) << "\n";
      if (resp.more()) std::cerr << "more: --after " << resp.events(resp.events_size() - 1).sequence() << "\n";
    }
    return 0;
  });
}

void AddLogs(CLI::App& app, const Cli& cli) {
  auto job = std::make_shared<std::string>();
  auto follow = std::make_shared<bool>(false);
  auto* logs =
      JobCommand(app, "logs",
                 "Show what the daemon said about a job: the data it read, the model, the memory plan's "
                 "choices and why, warnings, retries, state changes and checkpoints",
                 "Examples:\n  oomb logs job-abc123\n  oomb logs job-abc123 -f\n  oomb logs job-abc123 -o json", job);
  logs->add_flag("-f,--follow", *follow, "Then follow new ones until the job ends (exit code as `oomb watch`)");
  OnRun(logs, [cli, job, follow] { return Logs(cli.client(), JobName(cli.globals, *job), *follow); });
}

// cancel, pause, resume: one JOB in, the job out.
template <typename Request, typename Call>
void AddStateCommand(CLI::App& app, const Cli& cli, const char* name, const char* help, Call call) {
  auto job = std::make_shared<std::string>();
  auto* cmd = JobCommand(app, name, help, fmt::format("Example:\n  oomb {} job-abc123", name), job);
  OnRun(cmd, [cli, job, call] {
    Request req;
    req.set_name(JobName(cli.globals, *job));
    v1::Job out;
    const grpc::Status s = cli.client().Call(call, req, &out);
    if (!s.ok()) return Fail(s);
    if (!PrintStructured(cli.globals, out)) std::cout << out.name() << " " << StateName(out.state()) << "\n";
    return 0;
  });
}

void AddDeleteAndCheckpoints(CLI::App& app, const Cli& cli) {
  auto job = std::make_shared<std::string>();
  auto purge = std::make_shared<bool>(false);
  auto* del =
      JobCommand(app, "delete", "Delete a finished job's record (its checkpoint files are kept, unless --purge)",
                 "Examples:\n  oomb delete job-abc123\n  oomb delete job-abc123 --purge", job);
  del->add_flag("--purge", *purge, "Also remove the job's files: its checkpoint directory and metrics");
  OnRun(del, [cli, job, purge] {
    v1::DeleteJobRequest req;
    req.set_name(JobName(cli.globals, *job));
    req.set_purge(*purge);
    v1::DeleteJobResponse resp;
    const grpc::Status s = cli.client().Call(&v1::JobService::Stub::DeleteJob, req, &resp);
    if (!s.ok()) return Fail(s);
    if (!PrintStructured(cli.globals, resp)) std::cout << "deleted " << req.name() << "\n";
    return 0;
  });
  auto cjob = std::make_shared<std::string>();
  auto* ck = JobCommand(app, "checkpoints", "List a job's checkpoints",
                        "Example:\n  oomb checkpoints job-abc123 -o json", cjob);
  OnRun(ck, [cli, cjob] {
    v1::ListCheckpointsRequest req;
    req.set_name(JobName(cli.globals, *cjob));
    v1::ListCheckpointsResponse resp;
    const grpc::Status s = cli.client().Call(&v1::JobService::Stub::ListCheckpoints, req, &resp);
    if (!s.ok()) return Fail(s);
    if (PrintStructured(cli.globals, resp)) return 0;
    std::cout << fmt::format("{:>8} {:>10} {:<6} {:<19} {}\n", "STEP", "SIZE", "FINAL", "CREATED", "PATH");
    for (const v1::Checkpoint& c : resp.checkpoints()) {
      std::cout << fmt::format("{:>8} {:>10} {:<6} {:<19} {}\n", c.step(), Bytes(c.bytes()), c.final() ? "yes" : "",
                               Time(c.create_time()), c.path());
    }
    // How to load the newest (the final one when there is one): the exact code, with the
    // configuration it was trained with.
    if (resp.checkpoints_size() > 0) {
      const v1::Checkpoint& newest = resp.checkpoints(resp.checkpoints_size() - 1);
      std::cout << "\nLoad step " << newest.step() << " with:\n" << newest.load_code() << "\n";
    }
    return 0;
  });
}

// update: labels, priority and display name of a job not yet finished (UpdateJob, AIP-134).
void AddUpdate(CLI::App& app, const Cli& cli) {
  auto job = std::make_shared<std::string>();
  auto* update = JobCommand(app, "update", "Change a job's labels, priority or display name",
                            "Examples:\n  oomb update job-abc123 --priority 10\n"
                            "  oomb update job-abc123 --label team=nlp --label run=3 --display-name 'long run'\n"
                            "--label replaces the job's labels with those given.",
                            job);
  struct Args {
    std::vector<std::string> labels;
    std::optional<int> priority;
    std::optional<std::string> display_name;
  };
  auto a = std::make_shared<Args>();
  update->add_option("--label", a->labels, "A label k=v (repeatable); the labels become exactly these");
  update->add_option("--priority", a->priority, "Queue priority (higher runs first)");
  update->add_option("--display-name", a->display_name, "Display name");
  OnRun(update, [cli, job, a] {
    v1::UpdateJobRequest req;
    req.mutable_job()->set_name(JobName(cli.globals, *job));
    if (!a->labels.empty()) {
      for (const std::string& l : a->labels) {
        const size_t eq = l.find('=');
        if (eq == std::string::npos || eq == 0) {
          std::cerr << "oomb: error: --label: expected k=v, got '" << l << "'\n";
          return static_cast<int>(kUsage);
        }
        (*req.mutable_job()->mutable_labels())[l.substr(0, eq)] = l.substr(eq + 1);
      }
      req.mutable_update_mask()->add_paths("labels");
    }
    if (a->priority) {
      req.mutable_job()->set_priority(*a->priority);
      req.mutable_update_mask()->add_paths("priority");
    }
    if (a->display_name) {
      req.mutable_job()->mutable_spec()->set_display_name(*a->display_name);
      req.mutable_update_mask()->add_paths("spec.display_name");
    }
    if (req.update_mask().paths().empty()) {
      std::cerr << "oomb: error: name something to change: --label, --priority or --display-name\n";
      return static_cast<int>(kUsage);
    }
    v1::Job out;
    const grpc::Status s = cli.client().Call(&v1::JobService::Stub::UpdateJob, req, &out);
    if (!s.ok()) return Fail(s);
    if (!PrintStructured(cli.globals, out)) PrintJobDetail(out);
    return 0;
  });
}

}  // namespace

void AddJobCommands(CLI::App& app, const Cli& cli) {
  AddSubmit(app, cli);
  AddList(app, cli);
  AddGet(app, cli);
  AddWatchAndEvents(app, cli);
  AddLogs(app, cli);
  AddPlot(app, cli);
  using Stub = v1::JobService::Stub;
  AddStateCommand<v1::CancelJobRequest>(app, cli, "cancel", "Cancel a job (it stops at the next chunk boundary)",
                                        &Stub::CancelJob);
  AddStateCommand<v1::PauseJobRequest>(app, cli, "pause", "Pause a job (checkpoint, release the device)",
                                       &Stub::PauseJob);
  AddStateCommand<v1::ResumeJobRequest>(
      app, cli, "resume", "Queue a paused job again (it continues from its checkpoint)", &Stub::ResumeJob);
  AddDeleteAndCheckpoints(app, cli);
  AddUpdate(app, cli);
}

}  // namespace oomb::client
