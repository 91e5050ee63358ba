// How a user loads what oomb wrote: the Python that loads a checkpoint with transformers (and
// PEFT for an adapter), with the configuration the model was trained with. Torch-free.
#ifndef OOMB_WORKER_HF_LOADING_CODE_H_
#define OOMB_WORKER_HF_LOADING_CODE_H_

#include <string>

namespace oomb {

// Beside a LoRA adapter: the base model's config.json as trained (RoPE scaling and the extended
// max_position_embeddings), to load the base with. A full fine-tune's own config.json is that
// config already.
inline constexpr char kBaseConfigFile[] = "base_config.json";

struct LoadingCodeOptions {
  std::string checkpoint_path;  // the checkpoint directory
  std::string base_model_path;  // the base model (LoRA)
  bool lora = true;
  bool has_base_config = true;  // the checkpoint holds kBaseConfigFile (LoRA)
};

// Python lines (no trailing newline) that load the model and tokenizer: for LoRA,
// AutoConfig from kBaseConfigFile, the base with that config, then PeftModel over it.
std::string LoadingCode(const LoadingCodeOptions& options);

}  // namespace oomb

#endif  // OOMB_WORKER_HF_LOADING_CODE_H_
