// `oombd run JOB.yaml`: one job in the foreground, without the service, through the same
// executor the daemon uses (worker/job/executor.h). Progress: a live line on a TTY (stderr),
// plain lines otherwise; per-step metrics.jsonl and checkpoints in the checkpoint directory.
// Ctrl-C pauses at the next chunk boundary with a checkpoint (`--resume` continues); a second
// Ctrl-C cancels.
#include <unistd.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <utility>

#include "proto/spec/spec_codec.h"
#include "server/commands.h"
#include "server/job_files.h"
#include "server/job_spec.h"
#include "worker/common/checkpoint_dir.h"
#include "worker/common/file_access.h"
#include "worker/common/status.h"
#include "worker/hf/loading_code.h"
#include "worker/job/executor.h"
#include "worker/metrics/eval_report.h"
#include "worker/plan/context_window.h"

namespace oomb::server {
namespace {

std::atomic<int> g_interrupts{0};

// Who owns the checkpoint directories `oombd run` writes (a daemon's jobs are refused there).
constexpr char kRunJobId[] = "oombd-run";

void OnSigint(int) { g_interrupts.fetch_add(1); }

std::string Bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", v, units[u]);
}

std::string Duration(double s) {
  const int64_t t = static_cast<int64_t>(s);
  return t >= 3600 ? fmt::format("{}h{:02}m", t / 3600, t / 60 % 60) : fmt::format("{}m{:02}s", t / 60, t % 60);
}

struct RunFlags {
  std::string spec_path, checkpoint_dir, device;
  std::vector<std::string> sets;
  bool resume = false;
};

// The spec at f.spec_path with f's overrides, resolved; its checkpoint directory made absolute
// (the flag, else the spec's, else oomb-run-NAME) and checked; its RoPE scaling checked against
// the model's config.json, whose warnings are printed. `spec_yaml`: the spec as resolved.
absl::StatusOr<JobConfig> LoadRunSpec(const RunFlags& f, std::string* spec_yaml) {
  std::vector<std::string> sets = f.sets;
  if (!f.device.empty()) sets.push_back("resources.device=" + f.device);  // rank 0's; more: the next ones
  v1::JobSpec proto;
  spec::Lines lines;
  absl::Status loaded = spec::LoadYamlFile(f.spec_path, sets, &proto, &lines);
  absl::StatusOr<JobConfig> job = loaded.ok() ? ResolveJobSpec(&proto, {f.spec_path, ""}, &lines) : loaded;
  if (!job.ok()) return job.status();
  *spec_yaml = spec::ToYaml(proto);
  const std::string dir = !f.checkpoint_dir.empty() ? f.checkpoint_dir
                          : !job->checkpoint.dir.empty()
                              ? job->checkpoint.dir
                              : "oomb-run-" + (job->display_name.empty() ? std::string("job") : job->display_name);
  job->checkpoint.dir = std::filesystem::absolute(dir).lexically_normal().string();
  OOMB_RETURN_IF_ERROR(server::JobFiles::Unconfined(".").CheckSpec(*job, kRunJobId));
  absl::StatusOr<Dir> model_dir = FileAccess::Unconfined()->OpenDir(job->model.path);
  if (!model_dir.ok()) return Annotate(model_dir.status(), "model.path");
  OOMB_ASSIGN_OR_RETURN(const ModelConfig model, LoadModelConfig(*model_dir));
  OOMB_RETURN_IF_ERROR(CheckRopeScaling(model, *job));
  for (const std::string& w : ContextWindowWarnings(model, *job)) std::cerr << "warning: " << w << "\n";
  return job;
}

// The evaluation section's results after a step (step 0 of 0: method.type evaluate's), on one line.
std::string EvaluationLine(const StepReport& p, const EvalReport& e) {
  std::string line = p.total_steps == 0 ? "evaluation:" : fmt::format("evaluation after step {}:", p.step);
  for (const auto& [suite, result] : e) {
    if (const std::optional<double> a = result.accuracy())
      line += fmt::format(" {} {:.0f}%", SuiteName(suite), 100 * *a);
  }
  for (const auto& [suite, result] : e) {
    if (result.buckets.empty()) continue;
    line += " loss by position";
    for (const PositionLoss& b : result.buckets) line += fmt::format(" [{}, {}) {:.4f}", b.begin, b.end, b.loss);
  }
  return line;
}

// Progress on stderr: a live line on a terminal, one line per step otherwise (and one per
// evaluation); Ctrl-C pauses, a second one cancels.
void ReportTo(bool tty, RunOptions* options) {
  options->on_step = [tty](const StepReport& p) {
    if (p.total_steps == 0) {  // method.type evaluate: its one report
      if (p.eval_loss > 0) std::cerr << fmt::format("validation loss {:.4f}\n", p.eval_loss);
      if (p.evaluation.has_value()) std::cerr << EvaluationLine(p, *p.evaluation) << "\n";
      return;
    }
    const std::string line =
        fmt::format("step {}/{} loss {:.4f}{} lr {:.3g} {:.0f} tok/s mem {} eta {}{}", p.step, p.total_steps, p.loss,
                    p.router_aux_loss > 0 ? fmt::format(" router aux {:.4f}", p.router_aux_loss) : "", p.learning_rate,
                    p.tokens_per_second, Bytes(p.peak_device_bytes), Duration(p.eta_seconds),
                    p.eval_loss > 0 ? fmt::format(" eval {:.4f}", p.eval_loss) : "");
    if (tty) {
      const int width = 24;
      const int filled = p.total_steps > 0 ? static_cast<int>(width * p.step / p.total_steps) : 0;
      std::cerr << "\r\033[K[" << std::string(filled, '#') << std::string(width - filled, '-') << "] " << line
                << std::flush;
    } else {
      std::cerr << line << "\n";
    }
    if (p.evaluation.has_value()) std::cerr << (tty ? "\n" : "") << EvaluationLine(p, *p.evaluation) << "\n";
  };
  options->on_checkpoint = [tty](const CheckpointInfo& c) {
    std::cerr << (tty ? "\r\033[K" : "") << "checkpoint: " << c.path << " (" << Bytes(c.bytes) << ")\n";
  };
  options->on_warning = [tty](const std::string& w) {
    std::cerr << (tty ? "\r\033[K" : "") << "warning: " << w << "\n";
  };
  options->poll_stop = [] {
    const int n = g_interrupts.load();
    return n == 0 ? StopRequest::kNone : n == 1 ? StopRequest::kPause : StopRequest::kCancel;
  };
}

int RunMain(const RunFlags& f) {
  std::string spec_yaml;
  absl::StatusOr<JobConfig> job = LoadRunSpec(f, &spec_yaml);
  if (!job.ok()) {
    std::cerr << "oombd run: " << job.status().message() << "\n";
    return 2;
  }
  RunOptions options;
  options.files = FileAccess::Unconfined();  // the user's own files, at the user's terminal
  const std::string& checkpoint_dir = job->checkpoint.dir;
  absl::StatusOr<Dir> claimed = ClaimCheckpointDir(*options.files, checkpoint_dir, kRunJobId);
  if (!claimed.ok()) {
    std::cerr << "oombd run: --checkpoint-dir: " << claimed.status().message() << "\n";
    return 2;
  }
  options.checkpoint_dir = *std::move(claimed);
  options.resume = f.resume;
  options.spec_yaml = std::move(spec_yaml);
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  ReportTo(tty, &options);
  std::signal(SIGINT, OnSigint);
  std::cerr << "oombd run: " << f.spec_path << " -> " << checkpoint_dir << "\n";
  auto result = RunJob(*job, options);
  if (tty) std::cerr << "\n";
  if (!result.ok()) {
    std::cerr << "oombd run: job failed: " << result.status().message() << "\n";
    return 1;
  }
  switch (result->outcome) {
    case RunOutcome::kPaused:
      std::cerr << "oombd run: paused at " << result->final_checkpoint.path << "; continue with --resume\n";
      return 130;
    case RunOutcome::kCancelled:
      std::cerr << "oombd run: cancelled\n";
      return 130;
    case RunOutcome::kSucceeded:
      break;
  }
  if (job->method.type == TrainMethod::kEvaluate) {
    std::cerr << "oombd run: evaluated; the results are also in " << checkpoint_dir << "/metrics.jsonl\n";
    return 0;
  }
  const std::string& out = result->final_checkpoint.path;
  std::cout << out << "\n";
  LoadingCodeOptions load;
  load.checkpoint_path = out;
  load.base_model_path = job->model.path;
  load.lora = job->method.type != TrainMethod::kFull;
  std::cerr << "oombd run: done. Load it with transformers" << (load.lora ? " + PEFT" : "") << ":\n"
            << LoadingCode(load) << "\n";
  return 0;
}

}  // namespace

void RegisterRunCommands(CLI::App& app) {
  auto f = std::make_shared<RunFlags>();
  auto* run = app.add_subcommand("run", "Run one job spec in the foreground (no daemon)")
                  ->footer(
                      "Examples:\n  oombd run job.yaml\n  oombd run job.yaml --set training.max_steps=5 "
                      "--set memory.chunk_tokens=1024\n  oombd run job.yaml --checkpoint-dir out --resume");
  run->add_option("spec", f->spec_path, "job spec (YAML; fields: proto/oomb/v1/job_spec.proto)")->required();
  run->add_option("--set", f->sets, "field=value override, e.g. training.max_steps=5 (repeatable)");
  run->add_option("--checkpoint-dir", f->checkpoint_dir, "default: checkpoint.dir, else ./oomb-run-<display_name>");
  run->add_option("--device", f->device,
                  "cpu | cuda | cuda:N (default: resources.device); with resources.gpus k > 1, the first of k");
  run->add_flag("--resume", f->resume, "continue from the newest valid checkpoint in the checkpoint directory");
  run->callback([f] {
    const int rc = RunMain(*f);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace oomb::server
