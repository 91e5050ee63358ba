// Test helpers for the trainer tests: a tiny Llama / Qwen2 configuration, a Hugging Face
// directory (config.json + model.safetensors, no tokenizer) written from a random model, and
// seeded pre-tokenized JSONL datasets.
#ifndef OOMB_TESTS_WORKER_TINY_MODEL_H_
#define OOMB_TESTS_WORKER_TINY_MODEL_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tests/worker/test_files.h"
#include "worker/model/transformer.h"

namespace oomb::testing {

inline ModelConfig TinyLlamaConfig(int64_t vocab = 61, int64_t hidden = 32, int64_t layers = 2, int64_t heads = 4,
                                   int64_t kv_heads = 2) {
  ModelConfig c;
  c.model_type = "llama";
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = hidden + hidden / 4;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.max_position_embeddings = 1 << 20;
  c.rms_norm_eps = 1e-6;
  c.qkv_bias = false;
  c.tie_word_embeddings = false;
  c.rope.theta = 10000;
  return c;
}

// A tiny model of each family the trainer tests cover ("llama", "qwen2", "qwen3", "mistral",
// "gemma3", "phi3", "qwen3_moe", "mixtral", "gpt_oss"), each with what makes its family: biases,
// q/k norms, windows shorter than a chunk and no page multiple, fused projections, experts, sinks.
inline ModelConfig TinyConfig(const std::string& family) {
  ModelConfig c;
  c.model_type = family;
  c.architecture = family == "qwen2"       ? "Qwen2ForCausalLM"
                   : family == "qwen3"     ? "Qwen3ForCausalLM"
                   : family == "mistral"   ? "MistralForCausalLM"
                   : family == "gemma3"    ? "Gemma3ForCausalLM"
                   : family == "phi3"      ? "Phi3ForCausalLM"
                   : family == "qwen3_moe" ? "Qwen3MoeForCausalLM"
                   : family == "mixtral"   ? "MixtralForCausalLM"
                   : family == "gpt_oss"   ? "GptOssForCausalLM"
                                           : "LlamaForCausalLM";
  c.vocab_size = 61;
  c.hidden_size = 32;
  c.intermediate_size = 40;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-6;
  c.qkv_bias = family == "qwen2";
  c.qk_norm = family == "qwen3" || family == "qwen3_moe";
  if (c.qk_norm) c.head_dim = 16;  // independent of hidden / heads, as in Qwen3
  c.tie_word_embeddings = family != "qwen2";
  c.rope.theta = 10000;
  if (family == "phi3") {  // fused projections, RoPE over 6 of 8 features, longrope's long factors
    c.fused_projections = true;
    c.rotary_dim = 6;
    c.rope.type = RopeType::kLongrope;
    c.rope.original_max_position_embeddings = 16;
    c.rope.attention_factor = 1.2;
    c.rope.short_factor = {1.0, 1.5, 2.0};
    c.rope.long_factor = {1.0, 3.0, 7.0};
  }
  if (family == "qwen3_moe" || family == "mixtral") {  // 4 experts, 2 per token
    c.moe.experts = 4;
    c.moe.top_k = 2;
    c.moe.intermediate = 24;
    c.moe.layers = {true, family == "mixtral"};  // Qwen3-MoE: layer 1 dense (mlp_only_layers)
    c.moe.renormalize = c.moe.float_scores = family == "mixtral";
    // Mixtral with the router's auxiliary loss, its coefficient large enough to show in the gradients.
    if (family == "mixtral") c.moe.aux_loss_coef = 0.5;
  }
  if (family == "gpt_oss") {  // sinks, biases, YaRN; experts with biases and the clamped SwiGLU (a low limit, reached)
    c.attention_sinks = true;
    c.qkv_bias = c.o_bias = true;
    c.rope.type = RopeType::kYarn;
    c.rope.factor = 4;
    c.rope.original_max_position_embeddings = 16;
    c.rope.truncate = false;
    c.moe.experts = 4;
    c.moe.top_k = 2;
    c.moe.intermediate = 24;
    c.moe.layers = {true, true};
    c.moe.renormalize = c.moe.biases = c.moe.stored_banks = true;
    c.moe.swiglu_alpha = 1.702;
    c.moe.swiglu_limit = 1.0;
    c.moe.aux_loss_coef = 0.5;
  }
  if (family == "mistral" || family == "gemma3" || family == "phi3" || family == "mixtral" ||
      family == "gpt_oss") {  // a window of 11 (no page size's multiple here) in layer 0
    c.sliding_window = 11;
    c.sliding_layers = {true, false};
  }
  if (family == "gemma3") {  // its layer, an attention scale unlike head_dim's, the local layer's own RoPE
    c.gemma_layers = true;
    c.qk_norm = true;
    c.query_pre_attn_scalar = 12;
    c.rope.type = RopeType::kLinear;
    c.rope.factor = 2;
    c.sliding_rope.emplace().theta = 100;
  }
  return c;
}

// config.json for `c` as transformers writes it for LlamaForCausalLM (the keys LoadModelConfig
// reads).
inline std::string LlamaConfigJson(const ModelConfig& c, const std::string& dtype) {
  const nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}},
                            {"model_type", "llama"},
                            {"attention_bias", false},
                            {"mlp_bias", false},
                            {"hidden_act", "silu"},
                            {"vocab_size", c.vocab_size},
                            {"hidden_size", c.hidden_size},
                            {"intermediate_size", c.intermediate_size},
                            {"num_hidden_layers", c.num_layers},
                            {"num_attention_heads", c.num_heads},
                            {"num_key_value_heads", c.num_kv_heads},
                            {"head_dim", c.head_dim},
                            {"max_position_embeddings", c.max_position_embeddings},
                            {"rms_norm_eps", c.rms_norm_eps},
                            {"rope_theta", c.rope.theta},
                            {"tie_word_embeddings", c.tie_word_embeddings},
                            {"torch_dtype", dtype}};
  return j.dump(2) + "\n";
}

// A Hugging Face model directory holding a random model with config `c` (no tokenizer files).
inline void WriteTinyModelDir(const std::string& dir, const ModelConfig& c, at::ScalarType dtype, uint64_t seed) {
  auto model = Transformer::Random(c, dtype, at::kCPU, seed, /*init_std=*/0.2);
  std::filesystem::create_directories(dir);
  const absl::Status s =
      model->SaveFull(testing::OpenDir(dir), LlamaConfigJson(c, dtype == at::kDouble ? "float64" : "float32"));
  ASSERT_TRUE(s.ok()) << s;
}

// Seeded documents of token ids in [0, vocab), lengths uniform in [min_len, max_len].
inline std::vector<std::vector<int64_t>> RandomDocs(int n, int64_t min_len, int64_t max_len, int64_t vocab,
                                                    uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int64_t>> docs;
  for (int i = 0; i < n; ++i) {
    std::vector<int64_t> ids(min_len + static_cast<int64_t>(rng() % static_cast<uint64_t>(max_len - min_len + 1)));
    for (int64_t& id : ids) id = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
    docs.push_back(std::move(ids));
  }
  return docs;
}

inline void WriteInputIdsJsonl(const std::string& path, const std::vector<std::vector<int64_t>>& docs) {
  std::ofstream out(path);
  for (const auto& d : docs) out << nlohmann::json{{"input_ids", d}}.dump() << "\n";
}

// A fresh directory under the test temp dir, unique to this process (ctest runs test binaries
// in parallel).
inline std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/oomb_" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// PEFT starts LoRA's B at zero, which would make every dA zero: gradient checks draw B from
// N(0, 0.2^2) (float64 draws from the seeded generator, converted to the parameters' dtype).
inline void RandomizeLoraB(const Transformer& model, uint64_t seed) {
  at::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  for (auto& [name, p] : model.TrainableParameters()) {
    if (name.find("lora_B") != std::string::npos) p.copy_(at::normal(0, 0.2, p.sizes(), gen, at::kDouble));
  }
}

// Parameter gradients by name, taken from the model's trainable parameters (and reset there).
using Grads = std::map<std::string, at::Tensor>;

inline Grads TakeGrads(const Transformer& model) {
  Grads g;
  for (auto& [name, p] : model.TrainableParameters()) {
    if (p.grad().defined()) g[name] = p.grad().clone();
    p.mutable_grad().reset();
  }
  return g;
}

// The largest per-tensor relative error ||got - want|| / ||want|| (1e300 when a tensor of
// `want` is missing from `got`); `worst` names that tensor.
inline double MaxRelativeError(const Grads& got, const Grads& want, std::string* worst) {
  double max_err = 0;
  for (const auto& [name, w] : want) {
    const auto it = got.find(name);
    if (it == got.end()) {
      *worst = name + " missing";
      return 1e300;
    }
    const double err = ((it->second - w).norm() / w.norm().clamp_min(1e-300)).item<double>();
    if (err > max_err) {
      max_err = err;
      *worst = name;
    }
  }
  return max_err;
}

}  // namespace oomb::testing

#endif  // OOMB_TESTS_WORKER_TINY_MODEL_H_
