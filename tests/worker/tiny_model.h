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
