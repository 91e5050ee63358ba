// `oombd data build`: long texts -> JSONL samples of a target token length
// (worker/data/build.h); `oombd data retrieval`: the evaluation suites' passkey, needle and ruler
// documents as training samples (worker/job/eval_suites.h, worker/job/ruler.h), each line marked
// with the generator that made it ("generator"), so that a job evaluating that suite warns.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "server/commands.h"
#include "worker/common/file_access.h"
#include "worker/common/status.h"
#include "worker/data/build.h"
#include "worker/hf/tokenizer.h"
#include "worker/job/eval_suites.h"
#include "worker/job/ruler.h"

namespace oomb::server {
namespace {

namespace fs = std::filesystem;

// The tokenizer of a model directory (its tokenizer.json).
absl::StatusOr<std::unique_ptr<Tokenizer>> OpenTokenizer(const std::string& model_dir) {
  OOMB_ASSIGN_OR_RETURN(const Dir dir, FileAccess::Unconfined()->OpenDir(model_dir));
  return Tokenizer::FromModelDir(dir);
}

struct RetrievalFlags {
  std::string model, suite = "passkey", haystack, output;
  RetrievalOptions options;
  std::vector<std::string> tasks;  // ruler
  int64_t samples = 1;             // ruler
};

// A ruler document as a training sample: its prompt, then its answers as RULER's one-shot
// examples write them (cwe numbered, vt by spaces, the others by commas), the loss on those.
nlohmann::json RulerLine(const Tokenizer& tok, const RulerDoc& d) {
  std::string answer;
  for (size_t i = 0; i < d.answers.size(); ++i) {
    if (d.task == RulerTask::kCwe) {
      absl::StrAppend(&answer, " ", i + 1, ". ", d.answers[i]);
    } else {
      absl::StrAppend(&answer, i == 0 ? " " : d.task == RulerTask::kVt ? " " : ", ", d.answers[i]);
    }
  }
  std::vector<int64_t> ids = d.prompt, labels(d.prompt.size(), kIgnoreLabel);
  for (const int32_t id : tok.Encode(answer)) {
    ids.push_back(id);
    labels.push_back(id);
  }
  return {{"input_ids", ids}, {"labels", labels}, {"generator", RulerGenerator(d.task)}};
}

// The ruler suite's documents as lines.
absl::StatusOr<std::string> RulerLines(const Tokenizer& tok, const RetrievalFlags& f) {
  RulerOptions o{.tasks = {}, .lengths = f.options.lengths, .samples = f.samples, .seed = f.options.seed};
  for (const std::string& t : f.tasks) o.tasks.push_back(*RulerTaskNamed(t));
  std::string haystack;
  if (!f.haystack.empty()) {
    OOMB_ASSIGN_OR_RETURN(haystack, FileAccess::Unconfined()->ReadFile(f.haystack));
  } else if (RulerNeedsHaystack(o.tasks)) {
    return absl::InvalidArgumentError(
        "--haystack: required by the ruler suite's essay tasks (or name --tasks "
        "without them)");
  }
  OOMB_ASSIGN_OR_RETURN(const PromptFormat format, RulerPromptFormat(tok));
  absl::StatusOr<std::vector<RulerDoc>> docs = RulerDocs(tok, format, haystack, o);
  if (!docs.ok()) return Annotate(docs.status(), "--lengths");
  std::string lines;
  for (const RulerDoc& d : *docs) absl::StrAppend(&lines, RulerLine(tok, d).dump(), "\n");
  return lines;
}

// The suite's documents as {"input_ids", "labels", "generator"} lines (labels -100 but on the
// answer).
absl::StatusOr<int64_t> WriteRetrievalDataset(const RetrievalFlags& f) {
  OOMB_ASSIGN_OR_RETURN(const std::unique_ptr<Tokenizer> tok, OpenTokenizer(f.model));
  std::vector<RetrievalDoc> docs;
  std::string lines;
  if (f.suite == "ruler") {
    OOMB_ASSIGN_OR_RETURN(lines, RulerLines(*tok, f));
  } else if (f.suite == "passkey") {
    OOMB_ASSIGN_OR_RETURN(docs, PasskeyDocs(*tok, f.options));
  } else {
    if (f.haystack.empty()) return absl::InvalidArgumentError("--haystack: required by the needle suite");
    OOMB_ASSIGN_OR_RETURN(const std::string text, FileAccess::Unconfined()->ReadFile(f.haystack));
    OOMB_ASSIGN_OR_RETURN(docs, NeedleDocs(*tok, text, f.options));
  }
  for (const RetrievalDoc& d : docs) {
    absl::StrAppend(&lines,
                    nlohmann::json{{"input_ids", d.doc.ids}, {"labels", d.doc.labels}, {"generator", f.suite}}.dump(),
                    "\n");
  }
  // Written beside the output and renamed over it: a link at the output's path is replaced, never
  // written through.
  const fs::path out(f.output);
  OOMB_ASSIGN_OR_RETURN(const Dir dir, FileAccess::Unconfined()->OpenDir(out.parent_path().string()));
  OOMB_RETURN_IF_ERROR(Annotate(dir.WriteFileAtomic(out.filename().string(), lines), "-o"));
  return static_cast<int64_t>(std::count(lines.begin(), lines.end(), '\n'));
}

void AddRetrieval(CLI::App* data) {
  auto f = std::make_shared<RetrievalFlags>();
  auto* retrieval =
      data->add_subcommand("retrieval", "The passkey, needle or ruler suite's documents as training samples")
          ->footer(
              "Writes {\"input_ids\", \"labels\", \"generator\"} JSONL, the loss on the answer only: documents\n"
              "of each --lengths at --depths depths, --trials each (ruler: --samples of each --tasks), as\n"
              "`oombd model eval --suite` builds them. \"generator\" names the suite (ruler: ruler/TASK): a job\n"
              "that trains on these lines while evaluating the same suite is warned. Use another --seed than\n"
              "the evaluation's (and a haystack held out from it), and know that a score on a format trained\n"
              "on says little about long context.\n"
              "Examples:\n  oombd data retrieval --model DIR --suite passkey --lengths 8192 65536 --depths 9 \\\n"
              "      --seed 1000 -o passkey-train.jsonl\n"
              "  oombd data retrieval --model DIR --suite ruler --tasks vt cwe --lengths 8192 --samples 50 \\\n"
              "      --seed 1000 -o ruler-train.jsonl");
  retrieval->add_option("--model", f->model, "model directory (tokenizer.json)")->required()->transform(AbsolutePath());
  retrieval->add_option("--suite", f->suite, "passkey | needle | ruler")
      ->check(CLI::IsMember({"passkey", "needle", "ruler"}));
  retrieval->add_option("--haystack", f->haystack, "needle, ruler's essay tasks: UTF-8 text file")
      ->transform(AbsolutePath());
  retrieval->add_option("--lengths", f->options.lengths, "tokens per document")->required();
  retrieval->add_option("--depths", f->options.depths, "depths from 0 to 1 (default 5)")->check(CLI::PositiveNumber);
  retrieval->add_option("--trials", f->options.trials, "documents per length and depth (default 1)")
      ->check(CLI::PositiveNumber);
  std::vector<std::string> tasks;
  for (const RulerTask t : kRulerTasks) tasks.push_back(RulerTaskName(t));
  retrieval->add_option("--tasks", f->tasks, "ruler: RULER's tasks (default: all 11)")->check(CLI::IsMember(tasks));
  retrieval->add_option("--samples", f->samples, "ruler: documents per task and length (default 1)")
      ->check(CLI::PositiveNumber);
  retrieval->add_option("--seed", f->options.seed, "seed of the keys and the haystack offsets")->required();
  retrieval->add_option("-o,--output", f->output, "output JSONL file")->required()->transform(AbsolutePath());
  retrieval->callback([f] {
    absl::StatusOr<int64_t> n = WriteRetrievalDataset(*f);
    if (!n.ok()) {
      std::cerr << "oombd data retrieval: " << n.status().message() << "\n";
      throw CLI::RuntimeError(n.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
    }
    std::cout << nlohmann::json{{"samples", *n}, {"output", f->output}}.dump() << "\n";
  });
}

}  // namespace

void RegisterDataCommands(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Prepare datasets");
  data->require_subcommand(1);
  AddRetrieval(data);

  struct BuildFlags {
    std::string model, output;
    std::vector<std::string> inputs;
    BuildOptions options;
  };
  auto f = std::make_shared<BuildFlags>();
  auto* build =
      data->add_subcommand("build", "Cut long texts into {\"text\"} JSONL samples of about --tokens tokens")
          ->footer(
              "Files are cut on their own, at paragraph boundaries where possible (then lines, sentences,\n"
              "words); every sample has at most --tokens tokens of the model's tokenizer. Prints\n"
              "{\"files\", \"samples\", \"tokens\", \"min_sample_tokens\", \"max_sample_tokens\"} on stdout.\n"
              "Example:\n  oombd data build --model ~/.cache/oomb/data/models/SmolLM2-135M-Instruct --tokens 16384 \\\n"
              "      ~/.cache/oomb/data/texts/austen -o austen-16k.jsonl");
  build->add_option("--model", f->model, "model directory (tokenizer.json)")->required()->transform(AbsolutePath());
  build->add_option("--tokens", f->options.target_tokens, "most tokens per sample")->check(CLI::PositiveNumber);
  build->add_option("--overlap", f->options.overlap_tokens, "tokens of the previous sample repeated at the start")
      ->check(CLI::NonNegativeNumber);
  build->add_option("--max-samples", f->options.max_samples, "stop after this many samples (0: all)")
      ->check(CLI::NonNegativeNumber);
  build->add_option("-o,--output", f->output, "output JSONL file")->required()->transform(AbsolutePath());
  build->add_option("inputs", f->inputs, "text files or directories of them")->required()->transform(AbsolutePath());
  build->callback([f] {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = OpenTokenizer(f->model);
    if (!tok.ok()) {
      std::cerr << "oombd data build: " << tok.status().message() << "\n";
      throw CLI::RuntimeError(1);
    }
    auto st = BuildTextDataset(f->inputs, **tok, f->options, f->output);
    if (!st.ok()) {
      std::cerr << "oombd data build: " << st.status().message() << "\n";
      throw CLI::RuntimeError(st.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
    }
    std::cout << nlohmann::json{{"files", st->files},
                                {"samples", st->samples},
                                {"tokens", st->tokens},
                                {"bytes", st->bytes},
                                {"min_sample_tokens", st->min_sample_tokens},
                                {"max_sample_tokens", st->max_sample_tokens},
                                {"output", f->output}}
                     .dump()
              << "\n";
  });
}

}  // namespace oomb::server
