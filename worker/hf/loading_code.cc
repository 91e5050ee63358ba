#include "worker/hf/loading_code.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace oomb {
namespace {

// A Python string literal: JSON's escaping is a subset of Python's.
std::string Py(const std::string& s) { return nlohmann::json(s).dump(); }

}  // namespace

std::string LoadingCode(const LoadingCodeOptions& o) {
  if (!o.lora) {
    return absl::StrCat("from transformers import AutoModelForCausalLM, AutoTokenizer\n",
                        "model = AutoModelForCausalLM.from_pretrained(", Py(o.checkpoint_path), ")\n",
                        "tokenizer = AutoTokenizer.from_pretrained(", Py(o.checkpoint_path), ")");
  }
  std::string code =
      "from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer\nfrom peft import PeftModel\n";
  if (o.has_base_config) {
    absl::StrAppend(&code, "config = AutoConfig.from_pretrained(", Py(o.checkpoint_path + "/" + kBaseConfigFile),
                    ")  # the RoPE scaling it was trained with\n", "base = AutoModelForCausalLM.from_pretrained(",
                    Py(o.base_model_path), ", config=config)\n");
  } else {
    absl::StrAppend(&code, "base = AutoModelForCausalLM.from_pretrained(", Py(o.base_model_path), ")\n");
  }
  absl::StrAppend(&code, "model = PeftModel.from_pretrained(base, ", Py(o.checkpoint_path), ")\n",
                  "tokenizer = AutoTokenizer.from_pretrained(", Py(o.checkpoint_path), ")");
  return code;
}

}  // namespace oomb
