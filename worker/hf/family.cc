#include "worker/hf/family.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace oomb {

// One per file in worker/hf/families/.
Family LlamaFamily();
Family Qwen2Family();
Family Qwen3Family();
Family Qwen3MoeFamily();
Family MixtralFamily();
Family GptOssFamily();
Family MistralFamily();
Family Gemma3Family();
Family Phi3Family();

const std::vector<Family>& Families() {
  static const std::vector<Family>* const kFamilies =
      new std::vector<Family>{LlamaFamily(),  Qwen2Family(),   Qwen3Family(),  Qwen3MoeFamily(), MixtralFamily(),
                              GptOssFamily(), MistralFamily(), Gemma3Family(), Phi3Family()};
  return *kFamilies;
}

const Family* FindFamily(const std::string& architecture, const std::string& model_type) {
  for (const Family& f : Families()) {
    if (model_type == f.model_type || architecture == f.architecture) return &f;
  }
  return nullptr;
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> out;
  for (const Family& f : Families()) {
    for (const ModelPreset& p : f.presets) out.push_back(p.name);
  }
  return out;
}

absl::StatusOr<ModelConfig> PresetConfig(const std::string& name) {
  for (const Family& f : Families()) {
    for (const ModelPreset& p : f.presets) {
      if (p.name == name) return ParseModelConfig(p.config.dump(), absl::StrCat("preset ", name));
    }
  }
  return absl::NotFoundError(
      absl::StrCat("no model preset '", name, "'; the presets: ", absl::StrJoin(PresetNames(), ", ")));
}

}  // namespace oomb
