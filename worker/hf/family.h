// Model families: the one place each architecture oomb trains is described. A family's file
// (worker/hf/families/<family>.cc) reads what its config.json says beyond the keys every family
// shares (ParseModelConfig reads those: sizes, heads, RoPE), which decides its layers
// (worker/hf/layer_spec.h), and holds its benchmark presets. Families() is the registry, in the
// order a config.json is matched against it.
//
// Adding a family: its file, its line in Families() (worker/hf/family.cc), its chat
// template (worker/hf/chat_template.cc), and its tests; a mixture of experts also reads
// ModelConfig::moe (families::ParseMoe) and names where its checkpoints keep the experts.
// Torch-free.
#ifndef OOMB_WORKER_HF_FAMILY_H_
#define OOMB_WORKER_HF_FAMILY_H_

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/hf/model_config.h"

namespace oomb {

// A benchmark's model (bench_train --model): a real model's config.json, with
// max_position_embeddings raised so that no benchmark length is refused for it.
struct ModelPreset {
  std::string name;
  nlohmann::json config;
};

struct Family {
  std::string architecture;  // config.json's architectures[0] ("LlamaForCausalLM")
  std::string model_type;    // config.json's model_type ("llama")
  // What config.json says of this family beyond the shared keys (already read into `c`): its
  // layers' flags, biases and sliding windows. UNIMPLEMENTED naming what oomb does not compute.
  absl::Status (*parse)(const nlohmann::json& root, const std::string& source, ModelConfig* c);
  // A vision-language checkpoint whose language model is of this family: that model's
  // config.json; nullopt for a config.json that is not such a checkpoint. Null: the family has none.
  std::optional<absl::StatusOr<nlohmann::json>> (*language_model_config)(const nlohmann::json& root,
                                                                         const std::string& source) = nullptr;
  std::vector<ModelPreset> presets;
};

// Every family, in match order.
const std::vector<Family>& Families();

// The first family whose model_type is `model_type` or whose architecture is `architecture`;
// null for none.
const Family* FindFamily(const std::string& architecture, const std::string& model_type);

// The presets of every family, in registry order, and one by name (NOT_FOUND listing them).
std::vector<std::string> PresetNames();
absl::StatusOr<ModelConfig> PresetConfig(const std::string& name);

}  // namespace oomb

#endif  // OOMB_WORKER_HF_FAMILY_H_
