// `oombd data build`: long texts -> JSONL samples of a target token length
// (worker/data/build.h).
#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>

#include "server/commands.h"
#include "worker/data/build.h"
#include "worker/hf/tokenizer.h"

namespace oomb::server {

void RegisterDataCommands(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Prepare datasets");
  data->require_subcommand(1);

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
  build->add_option("--model", f->model, "model directory (tokenizer.json)")->required();
  build->add_option("--tokens", f->options.target_tokens, "most tokens per sample")->check(CLI::PositiveNumber);
  build->add_option("--overlap", f->options.overlap_tokens, "tokens of the previous sample repeated at the start")
      ->check(CLI::NonNegativeNumber);
  build->add_option("--max-samples", f->options.max_samples, "stop after this many samples (0: all)")
      ->check(CLI::NonNegativeNumber);
  build->add_option("-o,--output", f->output, "output JSONL file")->required();
  build->add_option("inputs", f->inputs, "text files or directories of them")->required();
  build->callback([f] {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = absl::NotFoundError(f->model);
    if (absl::StatusOr<Dir> dir = FileAccess::Unconfined()->OpenDir(f->model); dir.ok()) {
      tok = Tokenizer::FromModelDir(*dir);
    } else {
      tok = dir.status();
    }
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
