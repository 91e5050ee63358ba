// The README.md beside what a job wrote (a Hugging Face model card): YAML front matter that the
// Hub and transformers' tools read (base_model, library_name, tags), then the base model, the
// data, the method, the final metrics, the code that loads it and the job's spec. Torch-free.
#ifndef OOMB_WORKER_HF_MODEL_CARD_H_
#define OOMB_WORKER_HF_MODEL_CARD_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace oomb {

inline constexpr char kModelCardFile[] = "README.md";

struct ModelCardOptions {
  std::string title;       // the job's display name (or name)
  std::string base_model;  // model.path
  bool lora = true;
  std::string method;    // in words: "LoRA rank 16, alpha 32 on q_proj, v_proj"
  std::string data;      // data.train
  std::string built_by;  // "oomb <commit>"
  int64_t step = 0;
  int64_t tokens = 0;
  // The newest value of each metric (loss, learning_rate, eval_loss, eval_<suite>_accuracy),
  // in the order shown.
  std::vector<std::pair<std::string, double>> metrics;
  std::string loading_code;  // LoadingCode (worker/hf/loading_code.h)
  std::string spec_yaml;     // the job's spec as it ran; empty: not shown
};

// The card's Markdown.
std::string ModelCard(const ModelCardOptions& options);

}  // namespace oomb

#endif  // OOMB_WORKER_HF_MODEL_CARD_H_
