// `oombd model inspect DIR`, `oombd model eval --model DIR --data FILE`, `oombd model generate`,
// `oombd tokenize`.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>

#include "server/commands.h"
#include "server/job_spec.h"
#include "worker/hf/tokenize_tool.h"
#include "worker/job/model_tools.h"
#include "worker/metrics/eval_report.h"

namespace oomb::server {

namespace {

void AddInspect(CLI::App* model) {
  struct InspectFlags {
    std::string dir, output = "text";
  };
  auto inspect_flags = std::make_shared<InspectFlags>();
  auto* inspect =
      model->add_subcommand("inspect", "Architecture, parameters, dtypes and context window")
          ->footer("Example:\n  oombd model inspect ~/.cache/oomb/data/models/SmolLM2-135M-Instruct -o json");
  inspect->add_option("dir", inspect_flags->dir, "model directory")->required()->transform(AbsolutePath());
  inspect->add_option("-o,--output", inspect_flags->output, "text | json")->check(CLI::IsMember({"text", "json"}));
  inspect->callback([inspect_flags] {
    auto r = InspectModel(inspect_flags->dir);
    if (!r.ok()) {
      std::cerr << "oombd model inspect: " << r.status().message() << "\n";
      throw CLI::RuntimeError(1);
    }
    if (inspect_flags->output == "json") {
      std::cout << *r << "\n";
      return;
    }
    const auto j = nlohmann::json::parse(*r);
    for (const auto& [k, v] : j.items())
      std::cout << k << ": " << (v.is_string() ? v.get<std::string>() : v.dump()) << "\n";
  });
}

// --rope-scaling's text (the spec's model.rope_scaling, as YAML) into `*out`; exits 2 naming the
// flag when it is refused.
void SetRopeScaling(const std::string& yaml, const char* command, std::optional<RopeScalingOverride>* out) {
  if (yaml.empty()) return;
  auto r = ParseRopeScaling(yaml, "--rope-scaling");
  if (!r.ok()) {
    std::cerr << command << ": " << r.status().message() << "\n";
    throw CLI::RuntimeError(2);
  }
  *out = *r;
}

constexpr const char* kRopeScalingHelp =
    "RoPE scaling over config.json's and the adapter's, as a job's model.rope_scaling "
    "(e.g. '{type: yarn, factor: 8, original_max_position_embeddings: 8192}')";

// The result as JSON: loss, tokens and samples when --data was scored; the suites' results
// (EvalReportJson) when run.
nlohmann::json EvalJson(const EvalResult& r) {
  nlohmann::json j = EvalReportJson(r.suites);
  if (r.samples > 0) j.update({{"loss", r.mean_loss}, {"tokens", r.tokens}, {"samples", r.samples}});
  return j;
}

void AddEval(CLI::App* model) {
  auto f = std::make_shared<EvalOptions>();
  auto rope = std::make_shared<std::string>();
  auto suites = std::make_shared<std::vector<std::string>>();
  std::vector<std::string> choices = {"loss"};
  for (const EvalSuite s : kEvalSuites) choices.push_back(SuiteName(s));
  auto tasks = std::make_shared<std::vector<std::string>>();
  auto* eval =
      model->add_subcommand("eval", "Evaluate a model (and adapter): loss, loss by position, passkey, needle, RULER")
          ->footer(
              "Prints {\"loss\", \"tokens\", \"samples\"} (mean cross-entropy over --data), with --suite positions\n"
              "\"positions\": {\"buckets\"} (loss by position), with passkey / needle {\"accuracy\", \"cells\"}: "
              "exact\n"
              "match of the greedy continuation at each length and depth, with ruler {\"scores\", \"averages\",\n"
              "\"threshold\", \"effective_length\"}: RULER's tasks scored on greedy generations (0-100).\nExamples:\n"
              "  oombd model eval --model DIR --data austen.jsonl --max-tokens 4096\n"
              "  oombd model eval --model DIR --adapter CKPT/final --suite passkey --lengths 8192 16384 --depths 5\n"
              "  oombd model eval --model DIR --suite needle --haystack persuasion.txt --lengths 32768\n"
              "  oombd model eval --model DIR --suite ruler --haystack emma.txt --lengths 4096 8192 --samples 20\n"
              "  oombd model eval --model DIR --suite ruler --tasks niah_single_1 vt cwe fwe --lengths 16384");
  eval->add_option("--model", f->model_dir, "model directory")->required()->transform(AbsolutePath());
  eval->add_option("--suite", *suites, "loss | positions | passkey | needle | ruler (repeatable; default: loss)")
      ->check(CLI::IsMember(choices));
  eval->add_option("--data", f->data_path, "JSONL dataset (loss, positions)")->transform(AbsolutePath());
  eval->add_option("--adapter", f->adapter_dir, "PEFT adapter directory (its base_config.json's RoPE applies)")
      ->transform(AbsolutePath());
  // The bounds of the job spec's evaluation section (proto/oomb/v1/job_spec.proto), which runs
  // the same suites.
  eval->add_option("--max-tokens", f->max_tokens, "stop after this many tokens of --data (0: all)")
      ->check(CLI::NonNegativeNumber);
  eval->add_option("--chunk-tokens", f->chunk_tokens, "tokens per chunk of the forward pass")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  eval->add_option("--lengths", f->lengths, "passkey / needle / ruler: tokens per document (default 4096)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 31));
  eval->add_option("--depths", f->depths, "passkey / needle: depths from 0 to 1 (default 5)")
      ->check(CLI::Range(1, 101));
  eval->add_option("--trials", f->trials, "passkey / needle: documents per length and depth (default 1)")
      ->check(CLI::Range(1, 1000));
  eval->add_option("--seed", f->seed, "passkey / needle / ruler: seed of the documents (default 1)");
  eval->add_option("--haystack", f->haystack, "needle, ruler's essay tasks: UTF-8 text file to hide the facts in")
      ->transform(AbsolutePath());
  std::vector<std::string> task_names;
  for (const RulerTask t : kRulerTasks) task_names.push_back(RulerTaskName(t));
  eval->add_option("--tasks", *tasks, "ruler: RULER's tasks (default: all 11)")->check(CLI::IsMember(task_names));
  eval->add_option("--samples", f->ruler_samples, "ruler: documents per task and length (default 20)")
      ->check(CLI::Range(int64_t{1}, int64_t{10000}));
  eval->add_option("--threshold", f->ruler_threshold, "ruler: the effective length's threshold (default 85.6)")
      ->check(CLI::Range(0.0, 100.0));
  eval->add_option("--dtype", f->dtype, "float32 | bfloat16")->check(CLI::IsMember({"float32", "bfloat16"}));
  eval->add_option("--device", f->device, "auto | cpu | cuda | cuda:N");
  eval->add_option("--rope-scaling", *rope, kRopeScalingHelp);
  eval->callback([f, rope, suites, tasks] {
    EvalOptions o = *f;
    for (const std::string& t : *tasks) {
      if (std::find(o.ruler_tasks.begin(), o.ruler_tasks.end(), *RulerTaskNamed(t)) == o.ruler_tasks.end()) {
        o.ruler_tasks.push_back(*RulerTaskNamed(t));
      }
    }
    SetRopeScaling(*rope, "oombd model eval", &o.rope_scaling);
    o.loss = suites->empty();
    for (const std::string& name : *suites) {
      if (name == "loss") {
        o.loss = true;
      } else if (std::find(o.suites.begin(), o.suites.end(), *SuiteNamed(name)) == o.suites.end()) {
        o.suites.push_back(*SuiteNamed(name));
      }
    }
    o.on_warning = [](const std::string& m) { std::cerr << "oombd model eval: warning: " << m << "\n"; };
    auto r = EvaluateModel(o);
    if (!r.ok()) {
      std::cerr << "oombd model eval: " << r.status().message() << "\n";
      throw CLI::RuntimeError(1);
    }
    std::cout << EvalJson(*r).dump() << "\n";
  });
}

void AddGenerate(CLI::App* model) {
  auto gen = std::make_shared<GenerateOptions>();
  auto rope = std::make_shared<std::string>();
  auto* generate =
      model->add_subcommand("generate", "Greedy continuation of a prompt (chunked prefill, key/value cache)")
          ->footer(
              "Prints {\"prompt_ids\", \"new_ids\", \"text\"}; prefill progress on stderr.\nExamples:\n"
              "  oombd model generate --model DIR --prompt 'The capital of France is'\n"
              "  oombd model generate --model DIR --adapter CKPT/final --prompt-file long_prompt.txt "
              "--max-new-tokens 64");
  generate->add_option("--model", gen->model_dir, "model directory")->required()->transform(AbsolutePath());
  generate->add_option("--adapter", gen->adapter_dir, "PEFT adapter directory (its base_config.json's RoPE applies)")
      ->transform(AbsolutePath());
  generate->add_option("--prompt", gen->prompt, "UTF-8 prompt");
  generate->add_option("--prompt-file", gen->prompt_file, "UTF-8 file holding the prompt")->transform(AbsolutePath());
  generate->add_option("--max-new-tokens", gen->max_new_tokens, "tokens to generate (default 16)")
      ->check(CLI::PositiveNumber);
  generate->add_option("--chunk-tokens", gen->prefill_chunk_tokens, "prompt tokens per prefill forward (default 4096)")
      ->check(CLI::PositiveNumber);
  generate->add_option("--dtype", gen->dtype, "float32 | bfloat16")->check(CLI::IsMember({"float32", "bfloat16"}));
  generate->add_option("--device", gen->device, "auto | cpu | cuda | cuda:N");
  generate->add_option("--rope-scaling", *rope, kRopeScalingHelp);
  generate->callback([gen, rope] {
    GenerateOptions o = *gen;
    SetRopeScaling(*rope, "oombd model generate", &o.rope_scaling);
    if (isatty(STDERR_FILENO)) {
      o.on_prefill = [](int64_t done, int64_t total) {
        std::cerr << "\rprefill " << done << "/" << total << " tokens" << (done == total ? "\n" : "") << std::flush;
      };
    }
    auto r = GreedyGenerate(o);
    if (!r.ok()) {
      std::cerr << "oombd model generate: " << r.status().message() << "\n";
      throw CLI::RuntimeError(1);
    }
    std::cout << nlohmann::json{{"prompt_ids", r->prompt_ids}, {"new_ids", r->new_ids}, {"text", r->text}}.dump()
              << "\n";
  });
}

void AddTokenize(CLI::App& app) {
  struct TokenizeFlags {
    std::string model;
    bool decode = false, special = false;
  };
  auto tok = std::make_shared<TokenizeFlags>();
  auto* tokenize = app.add_subcommand("tokenize", "UTF-8 text on stdin -> JSON token ids on stdout (--decode: back)")
                       ->footer(
                           "Example:\n  echo 'Hello' | oombd tokenize --model DIR\n"
                           "  echo '[19556]' | oombd tokenize --model DIR --decode");
  tokenize->add_option("--model", tok->model, "model directory (tokenizer.json)")
      ->required()
      ->transform(AbsolutePath());
  tokenize->add_flag("--decode", tok->decode, "read a JSON array of ids, print the text");
  tokenize->add_flag("--add-special-tokens", tok->special, "add BOS/EOS as the tokenizer's post-processor does");
  tokenize->callback([tok] {
    const int rc = RunTokenizeTool(tok->model, tok->decode, tok->special, std::cin, std::cout, std::cerr);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace

void RegisterModelCommands(CLI::App& app) {
  auto* model = app.add_subcommand("model", "Inspect or evaluate a Hugging Face model directory");
  model->require_subcommand(1);
  AddInspect(model);
  AddEval(model);
  AddGenerate(model);
  AddTokenize(app);
}

}  // namespace oomb::server
