// `oombd model inspect DIR`, `oombd model eval --model DIR --data FILE`, `oombd tokenize`.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>

#include "server/commands.h"
#include "worker/hf/tokenize_tool.h"
#include "worker/job/model_tools.h"

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
  inspect->add_option("dir", inspect_flags->dir, "model directory")->required();
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

void AddEval(CLI::App* model) {
  auto eval_flags = std::make_shared<EvalOptions>();
  auto* eval = model->add_subcommand("eval", "Mean next-token loss of a model (and adapter) on a JSONL file")
                   ->footer(
                       "Prints {\"loss\": mean cross-entropy, \"tokens\": scored tokens, \"samples\": n}.\n"
                       "Example:\n  oombd model eval --model DIR --data austen.jsonl --max-tokens 4096");
  eval->add_option("--model", eval_flags->model_dir, "model directory")->required();
  eval->add_option("--data", eval_flags->data_path, "JSONL dataset")->required();
  eval->add_option("--adapter", eval_flags->adapter_dir, "PEFT adapter directory");
  eval->add_option("--max-tokens", eval_flags->max_tokens, "stop after this many tokens (0: all)");
  eval->add_option("--chunk-tokens", eval_flags->chunk_tokens, "tokens per chunk of the forward pass");
  eval->add_option("--dtype", eval_flags->dtype, "float32 | bfloat16")->check(CLI::IsMember({"float32", "bfloat16"}));
  eval->add_option("--device", eval_flags->device, "auto | cpu | cuda");
  eval->callback([eval_flags] {
    auto r = EvaluateModel(*eval_flags);
    if (!r.ok()) {
      std::cerr << "oombd model eval: " << r.status().message() << "\n";
      throw CLI::RuntimeError(1);
    }
    std::cout << nlohmann::json{{"loss", r->mean_loss}, {"tokens", r->tokens}, {"samples", r->samples}}.dump() << "\n";
  });
}

void AddGenerate(CLI::App* model) {
  struct GenerateFlags {
    std::string model, prompt;
    int64_t max_new_tokens = 16;
  };
  auto gen = std::make_shared<GenerateFlags>();
  auto* generate = model->add_subcommand("generate", "Greedy continuation of a prompt (for checking the model)")
                       ->footer(
                           "Prints {\"prompt_ids\", \"new_ids\", \"text\"}.\nExample:\n"
                           "  oombd model generate --model DIR --prompt 'The capital of France is'");
  generate->add_option("--model", gen->model, "model directory")->required();
  generate->add_option("--prompt", gen->prompt, "UTF-8 prompt")->required();
  generate->add_option("--max-new-tokens", gen->max_new_tokens, "tokens to generate");
  generate->callback([gen] {
    auto r = GreedyGenerate(gen->model, gen->prompt, gen->max_new_tokens);
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
  tokenize->add_option("--model", tok->model, "model directory (tokenizer.json)")->required();
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
