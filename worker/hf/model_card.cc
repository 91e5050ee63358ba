// A checkpoint's model card: contract in worker/hf/model_card.h.
#include "worker/hf/model_card.h"

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace oomb {

std::string ModelCard(const ModelCardOptions& o) {
  // Front matter values as JSON strings: valid YAML scalars whatever the path holds.
  const auto quoted = [](const std::string& s) { return nlohmann::json(s).dump(); };
  std::string md =
      absl::StrCat("---\nbase_model: ", quoted(o.base_model), "\nlibrary_name: ", o.lora ? "peft" : "transformers",
                   "\ntags:\n- oomb\n", o.lora ? "- lora\n" : "", "---\n\n# ", o.title, "\n\n");
  absl::StrAppend(&md, "Fine-tuned from `", o.base_model, "` by ", o.built_by, ".\n\n", "- Method: ", o.method,
                  "\n- Data: `", o.data, "`\n- Trained: ", o.step, " optimizer steps, ", o.tokens, " tokens\n");
  if (!o.metrics.empty()) {
    absl::StrAppend(&md, "\n## Metrics at step ", o.step, "\n\n| metric | value |\n| --- | --- |\n");
    for (const auto& [name, value] : o.metrics) absl::StrAppend(&md, "| ", name, " | ", value, " |\n");
  }
  absl::StrAppend(&md, "\n## Loading\n\n```python\n", o.loading_code, "\n```\n");
  if (!o.spec_yaml.empty()) {
    absl::StrAppend(&md, "\n## Job spec\n\n```yaml\n", o.spec_yaml, absl::EndsWith(o.spec_yaml, "\n") ? "" : "\n",
                    "```\n");
  }
  return md;
}

}  // namespace oomb
