// The model computes what transformers computes: logits, loss and LoRA gradients of tiny
// random-weight Qwen2, Qwen3, Qwen3-MoE, Mixtral, Llama, Mistral, Gemma 3 (also as the text part
// of a vision-language checkpoint) and Phi-3 models (q/k/v biases, GQA, tied and untied
// embeddings, every rope_scaling type, partial rotary, sliding windows shorter than the sequence,
// local and global layers, fused projections, sharded weights, routed experts with and without
// renormalisation beside a dense layer, LoRA on the expert banks, the router's auxiliary loss) made by
// tests/python/make_tiny_models.py, against transformers' and PEFT's own outputs stored beside each model; adapters
// oomb saves load in PEFT; plus the model's error handling.
#include "worker/model/transformer.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "kernels/torch/paged_attention.h"
#include "tests/worker/test_env.h"
#include "tests/worker/test_files.h"
#include "worker/hf/safetensors.h"
#include "worker/kv/page_pool.h"
#include "worker/train/chunk_trainer.h"

namespace oomb {
namespace {

namespace fs = std::filesystem;

at::Tensor ToTensor(const TensorView& v, at::ScalarType t) {
  return at::from_blob(const_cast<void*>(v.data), v.shape, at::TensorOptions().dtype(t)).clone();
}

std::vector<std::string> TinyModels() {
  std::vector<std::string> names;
  const fs::path dir = fs::path(testing::DataDir()) / "tiny";
  if (!fs::exists(dir)) return names;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (fs::exists(e.path() / "reference.safetensors")) names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class TinyModelParityTest : public ::testing::TestWithParam<std::string> {};

// The chunked trainer of `model` for sequences of up to T tokens: chunks of 13 over pages of 8.
struct Chunked {
  Chunked(const Transformer& model, int64_t T) {
    const ModelConfig& c = model.config();
    const PageShape shape{c.num_kv_heads, 8, c.head_dim};
    const int64_t pages = c.num_layers * (T / 8 + 2);
    kv = PagePool::Create(PageKind::kKv, Tier::kDevice, shape, at::TensorOptions().dtype(at::kFloat), pages).value();
    grad =
        PagePool::Create(PageKind::kKvGrad, Tier::kDevice, shape, at::TensorOptions().dtype(at::kFloat), pages).value();
    ChunkTrainerOptions options;
    options.chunk_tokens = 13;
    trainer = std::make_unique<ChunkTrainer>(&model, kv.get(), grad.get(), options);
  }
  std::unique_ptr<PagePool> kv, grad;
  std::unique_ptr<ChunkTrainer> trainer;
};

// `ids` [T] as one document.
TokenSequence Document(const at::Tensor& ids) {
  return TokenSequence::FromDocument(
      std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.size(0)));
}

// One chunk of the whole sequence `ids` (positions from 0, one document).
ChunkInput WholeSequence(const at::Tensor& ids) {
  const int64_t T = ids.size(0);
  ChunkInput in;
  in.ids = ids;
  in.positions = at::arange(T, at::kLong);
  in.doc_start = at::zeros({T}, at::kLong);
  in.rope_seq_len = T;
  return in;
}

// The attention of `layer` over the whole sequence (no past), windowed where the layer is.
at::Tensor WholeSequenceAttention(const Transformer& model, const ChunkInput& in, int64_t layer, const at::Tensor& q,
                                  const at::Tensor& k, const at::Tensor& v) {
  const int64_t window = model.spec().layers[layer].window;
  return kernels::PagedAttention(q, k, v,
                                 window > 0 ? kernels::SlidingWindowStart(in.doc_start, 0, window) : in.doc_start,
                                 nullptr, 2048, kernels::GpuAttentionKernel::kCudnn, {}, model.sinks(layer));
}

// The logits of one forward over the whole sequence through the paged attention.
at::Tensor WholeSequenceLogits(const Transformer& model, const ChunkInput& in) {
  const at::Tensor hidden =
      model.Hidden(in, [&](int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
        return WholeSequenceAttention(model, in, layer, q, k, v);
      });
  return at::matmul(hidden, model.lm_head().t());
}

TEST_P(TinyModelParityTest, LogitsAndLossMatchTransformers) {
  const std::string dir = testing::DataDir() + "/tiny/" + GetParam();
  auto model = Transformer::Load(testing::OpenDir(dir), at::kFloat, at::kCPU);
  ASSERT_TRUE(model.ok()) << model.status();
  auto ref = WeightSet::Open(testing::OpenDir(dir), "reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status();
  const at::Tensor ids = ToTensor(*(*ref)->Find("input_ids"), at::kLong)[0];
  const at::Tensor want_logits = ToTensor(*(*ref)->Find("logits"), at::kFloat)[0];
  const double want_loss = ToTensor(*(*ref)->Find("loss"), at::kFloat).item<double>();
  const int64_t T = ids.size(0);

  // One forward over the whole sequence through the paged attention (no past).
  at::NoGradGuard no_grad;
  const at::Tensor logits = WholeSequenceLogits(**model, WholeSequence(ids));
  const double max_diff = (logits - want_logits).abs().max().item<double>();
  EXPECT_LE(max_diff, 1e-4) << GetParam();

  // Chunked (chunks of 13 over pages of 8) gives the same mean loss as transformers.
  Chunked chunked(**model, T);
  ChunkTrainer& trainer = *chunked.trainer;
  const TokenSequence seq = Document(ids);
  auto loss = trainer.EvalSequence(seq);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(loss->loss_sum / loss->label_tokens, want_loss, 1e-5) << GetParam();
}

// Every LoRA weight of `model` drawn from N(0, 0.2^2), seeded (B too: every gradient non-zero).
void DrawLora(Transformer& model, uint64_t seed) {
  at::NoGradGuard no_grad;
  at::manual_seed(seed);
  for (auto& [name, p] : model.TrainableParameters()) p.normal_(0, 0.2);
}

// transformers + PEFT's LoRA gradients (tests/python/make_tiny_models.py, DIR/NAME/lora/): the
// adapter PEFT saved loads, and both the model's autograd over the whole sequence and the chunked
// trainer (chunks of 13 over pages of 8) give PEFT's loss and gradients, of the LoRA weights and
// (autograd) of the input embeddings.
TEST_P(TinyModelParityTest, LoraGradientsMatchTransformersAndPeft) {
  const std::string dir = testing::DataDir() + "/tiny/" + GetParam();
  auto model = Transformer::Load(testing::OpenDir(dir), at::kFloat, at::kCPU);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*model)->LoadAdapter(testing::OpenDir(dir + "/lora")).ok());
  auto ref = WeightSet::Open(testing::OpenDir(dir + "/lora"), "reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto in_ref = WeightSet::Open(testing::OpenDir(dir), "reference.safetensors");
  ASSERT_TRUE(in_ref.ok()) << in_ref.status();
  const at::Tensor ids = ToTensor(*(*in_ref)->Find("input_ids"), at::kLong)[0];
  const int64_t T = ids.size(0);
  auto relative_error = [](const at::Tensor& got, const at::Tensor& want) {
    return (got - want).abs().max().item<double>() / want.abs().max().item<double>();
  };
  const auto params = (*model)->TrainableParameters();
  // The router's auxiliary loss, where the model has one: transformers' loss adds it.
  const double aux_coef = (*model)->config().moe.aux_loss_coef;
  ASSERT_EQ(params.size() + (aux_coef > 0 ? 3 : 2), (*ref)->names().size()) << "one reference gradient per LoRA weight";

  // Autograd over one full-sequence forward, from the input embeddings.
  ChunkInput in = WholeSequence(ids);
  RouterBalance balance;
  if (aux_coef > 0) in.balance = &balance;
  Transformer::Cursor cursor = (*model)->Begin(in);
  const at::Tensor embeds = cursor.h.detach().requires_grad_(true);
  cursor.h = embeds;
  while (cursor.layer < (*model)->config().num_layers) {
    const auto [q, k, v] = (*model)->AttentionInputs(cursor);
    (*model)->FinishLayer(cursor, WholeSequenceAttention(**model, in, cursor.layer, q, k, v));
  }
  const at::Tensor logits = at::matmul((*model)->End(cursor), (*model)->lm_head().t());
  at::Tensor loss = at::cross_entropy_loss(logits.slice(0, 0, T - 1), ids.slice(0, 1));
  if (aux_coef > 0) {
    const double want_aux = ToTensor(*(*ref)->Find("router_aux_loss"), at::kFloat).item<double>();
    EXPECT_NEAR(balance.Loss().item<double>(), want_aux, 1e-5);
    loss = loss + balance.Loss() * aux_coef;
  }
  loss.backward();
  EXPECT_NEAR(loss.item<double>(), ToTensor(*(*ref)->Find("loss"), at::kFloat).item<double>(), 1e-5);
  EXPECT_LE(relative_error(embeds.grad(), ToTensor(*(*ref)->Find("input_grad"), at::kFloat)[0]), 1e-4);
  for (const auto& [name, p] : params) {
    const TensorView* want = (*ref)->Find(name);
    ASSERT_NE(want, nullptr) << name;
    EXPECT_LE(relative_error(p.grad(), ToTensor(*want, at::kFloat)), 1e-4) << name;
    p.mutable_grad() = at::Tensor();
  }

  // The chunked trainer: the same gradients.
  Chunked chunked(**model, T);
  ChunkTrainer& trainer = *chunked.trainer;
  const TokenSequence seq = Document(ids);
  auto trained = trainer.TrainSequence(seq, 1.0 / static_cast<double>(T - 1), 0);
  ASSERT_TRUE(trained.ok()) << trained.status();
  if (aux_coef > 0) {
    EXPECT_NEAR(trained->router_aux, ToTensor(*(*ref)->Find("router_aux_loss"), at::kFloat).item<double>(), 1e-5);
  }
  for (const auto& [name, p] : params) {
    EXPECT_LE(relative_error(p.grad(), ToTensor(*(*ref)->Find(name), at::kFloat)), 1e-4) << "chunked " << name;
  }
}

// An adapter oomb saves loads back in oomb as it was, and in PEFT (tests/python/check_peft_adapter.py:
// the venv's release, and each older one installed beside it): PEFT's logits with it equal oomb's.
TEST_P(TinyModelParityTest, SavedAdapterLoadsInPeft) {
  const std::string python = testing::VenvPython();
  if (python.empty()) GTEST_SKIP() << "no Python venv";
  const std::string dir = testing::DataDir() + "/tiny/" + GetParam();
  auto model = Transformer::Load(testing::OpenDir(dir), at::kFloat, at::kCPU);
  ASSERT_TRUE(model.ok()) << model.status();
  LoraOptions lora;  // every linear layer (the fused ones on Phi-3)
  lora.rank = 2;
  lora.alpha = 4;
  ASSERT_TRUE((*model)->AddLora(lora, 3).ok());
  DrawLora(**model, 11);  // the same adapter every run: the logits' distance to PEFT's is then fixed
  const std::string out = testing::ScratchDir("peft_" + GetParam());
  ASSERT_TRUE((*model)->SaveLora(testing::OpenDir(out), dir).ok());
  auto reloaded = Transformer::Load(testing::OpenDir(dir), at::kFloat, at::kCPU);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  const absl::Status read_back = (*reloaded)->LoadAdapter(testing::OpenDir(out));
  ASSERT_TRUE(read_back.ok()) << read_back;
  const auto saved = (*model)->TrainableParameters(), loaded = (*reloaded)->TrainableParameters();
  ASSERT_EQ(saved.size(), loaded.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(saved[i].first, loaded[i].first);
    EXPECT_TRUE(at::equal(saved[i].second, loaded[i].second)) << saved[i].first;
  }
  auto ref = WeightSet::Open(testing::OpenDir(dir), "reference.safetensors");
  ASSERT_TRUE(ref.ok());
  const at::Tensor ids = ToTensor(*(*ref)->Find("input_ids"), at::kLong)[0];
  const int64_t T = ids.size(0);
  at::NoGradGuard no_grad;
  const at::Tensor logits = WholeSequenceLogits(**model, WholeSequence(ids)).contiguous();
  TensorView v;
  v.name = "logits";
  v.dtype = DType::kF32;
  v.shape = {T, logits.size(1)};
  v.data = logits.data_ptr();
  v.nbytes = logits.nbytes();
  ASSERT_TRUE(WriteSafetensors(testing::OpenDir(out), "oomb_logits.safetensors", {v}, {}).ok());
  EXPECT_EQ(testing::RunCommand(python + " " + testing::SourceDir() + "/tests/python/check_peft_adapter.py " + dir +
                                " " + out),
            0);
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Tiny, TinyModelParityTest, ::testing::ValuesIn(TinyModels()), [](const auto& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
});
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TinyModelParityTest);

// The gradients' reach after a chunked pass over the reference sequence, on the tiny Qwen3-MoE
// (3 layers, layer 1 dense, 4 experts, top-2): LoRA on every linear layer's name (attention, the
// dense layer's MLP and both expert banks; weights drawn at random), then full fine-tuning. Each
// bank's experts are told apart along its layout (LoRA B [out, r E]: expert e's columns k E + e;
// a weight [E, out, in]), checked with gradients set by hand.
TEST(TransformerTest, ReachCountsTheModulesAndExpertsTheGradientsReached) {
  const std::string dir = testing::DataDir() + "/tiny/qwen3-moe";
  if (!fs::exists(dir)) GTEST_SKIP() << "no " << dir;
  auto model = Transformer::Load(testing::OpenDir(dir), at::kFloat, at::kCPU);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*model)->AddLora(LoraOptions{.rank = 4, .alpha = 8}, 1).ok());
  DrawLora(**model, 5);
  auto ref = WeightSet::Open(testing::OpenDir(dir), "reference.safetensors");
  ASSERT_TRUE(ref.ok());
  const at::Tensor ids = ToTensor(*(*ref)->Find("input_ids"), at::kLong)[0];
  auto group = [](const GradientReach& r, const std::string& name) {
    for (const GradientReach::Group& g : r.groups) {
      if (g.name == name) return g;
    }
    ADD_FAILURE() << "no group " << name << " in " << r.Describe();
    return GradientReach::Group{};
  };
  auto layer_of = [](const std::string& name) {
    const size_t at = name.find("layers.") + 7;
    return std::stoll(name.substr(at, name.find('.', at) - at));
  };
  const GradientReach none = (*model)->Reach();
  EXPECT_FALSE(none.every());
  EXPECT_EQ(none.Describe(),
            "self_attn.q_proj 0/3, self_attn.k_proj 0/3, self_attn.v_proj 0/3, self_attn.o_proj 0/3, "
            "mlp.gate_proj 0/1, mlp.up_proj 0/1, mlp.down_proj 0/1, "
            "mlp.experts.gate_up_proj 0/2 (experts 0/8), mlp.experts.down_proj 0/2 (experts 0/8)");

  Chunked chunked(**model, ids.size(0));
  ASSERT_TRUE(chunked.trainer->TrainSequence(Document(ids), 1.0, 0).ok());
  const GradientReach trained = (*model)->Reach();
  for (const char* name : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"}) {
    EXPECT_EQ(group(trained, name).reached, 3) << name;
  }
  for (const char* name : {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
    EXPECT_EQ(group(trained, name).reached, 1) << name;
  }
  for (const char* name : {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}) {
    const GradientReach::Group g = group(trained, name);
    EXPECT_EQ(g.reached, 2) << name;
    EXPECT_GE(g.experts_reached, 4) << name;  // top-2 of each sparse layer, at least
    EXPECT_LE(g.experts_reached, 8) << name;
  }
  // By hand: each bank's B reaches expert (layer % 4) alone; layer 0's q_proj nothing.
  for (auto& [name, p] : (*model)->TrainableParameters()) {
    if (name.find(".mlp.experts") != std::string::npos && name.find("lora_B") != std::string::npos) {
      at::Tensor g = at::zeros_like(p);
      const int64_t E = 4, e = layer_of(name) % E;
      for (int64_t k = 0; k < p.size(1) / E; ++k) g.select(1, k * E + e).fill_(1);
      p.mutable_grad() = g;
    }
    if (name.find("layers.0.self_attn.q_proj.lora_B") != std::string::npos) p.mutable_grad() = at::zeros_like(p);
  }
  const GradientReach by_hand = (*model)->Reach();
  EXPECT_FALSE(by_hand.every());
  EXPECT_EQ(group(by_hand, "self_attn.q_proj").reached, 2);
  EXPECT_EQ(group(by_hand, "mlp.experts.gate_up_proj").experts_reached, 2);
  EXPECT_EQ(group(by_hand, "mlp.experts.down_proj").experts_reached, 2);

  // Full fine-tuning: every weight reached; a bank [E, out, in] by its first dimension.
  auto full = Transformer::Load(testing::OpenDir(dir), at::kFloat, at::kCPU);
  ASSERT_TRUE(full.ok());
  (*full)->EnableFullFineTuning();
  Chunked full_chunked(**full, ids.size(0));
  ASSERT_TRUE(full_chunked.trainer->TrainSequence(Document(ids), 1.0, 0).ok());
  const GradientReach weights = (*full)->Reach();
  for (const GradientReach::Group& g : weights.groups) EXPECT_EQ(g.reached, g.modules) << g.name;
  EXPECT_EQ(group(weights, "embed_tokens").modules, 1);
  EXPECT_EQ(group(weights, "mlp.experts.gate_up_proj").experts, 8);
  for (auto& [name, p] : (*full)->BaseParameters()) {
    if (p.dim() == 3) {
      at::Tensor g = at::zeros_like(p);
      g[1].fill_(1);
      p.mutable_grad() = g;
    }
  }
  EXPECT_EQ(group((*full)->Reach(), "mlp.experts.down_proj").experts_reached, 2);
}

// The experts' two kernels (ExpertKernel): grouped GEMMs give the loop's logits, and gradients
// of the LoRA weights (attention and both banks) and, in full fine-tuning, of every weight, also
// with backward recomputing the experts' gate_up products (Transformer::set_expert_recompute_layers), on
// the tiny Qwen3-MoE and Mixtral in float32 over the chunked trainer (the CPU runs PyTorch's
// grouped loop; the GPU's one kernel is ExpertsGpuTest's). Float64 has no grouped GEMM: kAuto
// takes the loop there, as on every CPU.
TEST(TransformerTest, GroupedExpertsGiveTheLoopsValuesAndGradients) {
  for (const std::string name : {"qwen3-moe", "mixtral-window", "qwen3-moe-aux", "gpt-oss"}) {
    const std::string dir = testing::DataDir() + "/tiny/" + name;
    if (!fs::exists(dir)) GTEST_SKIP() << "no " << dir;
    auto ref = WeightSet::Open(testing::OpenDir(dir), "reference.safetensors");
    ASSERT_TRUE(ref.ok());
    const at::Tensor ids = ToTensor(*(*ref)->Find("input_ids"), at::kLong)[0];
    for (const bool full : {false, true}) {
      auto model = Transformer::Load(testing::OpenDir(dir), at::kFloat, at::kCPU);
      ASSERT_TRUE(model.ok()) << model.status();
      if (full) {
        (*model)->EnableFullFineTuning();
      } else {
        ASSERT_TRUE((*model)->LoadAdapter(testing::OpenDir(dir + "/lora")).ok());
      }
      EXPECT_EQ((*model)->expert_kernel(), ExpertKernel::kLoop) << "kAuto on a CPU";
      // The loop, the grouped products, and those recomputing the gate_up products in backward in
      // every sparse layer (where GroupedExpertMlp runs them: LoRA, no biases).
      std::vector<std::pair<at::Tensor, std::map<std::string, at::Tensor>>> got;
      for (const int64_t recompute : {-1, 0, 1000}) {
        (*model)->set_expert_kernel(recompute < 0 ? ExpertKernel::kLoop : ExpertKernel::kGrouped);
        (*model)->set_expert_recompute_layers(std::max<int64_t>(recompute, 0));
        auto& [logits, grads] = got.emplace_back();
        {
          at::NoGradGuard no_grad;
          logits = WholeSequenceLogits(**model, WholeSequence(ids));
        }
        Chunked chunked(**model, ids.size(0));
        ASSERT_TRUE(chunked.trainer->TrainSequence(Document(ids), 1.0 / static_cast<double>(ids.size(0) - 1), 0).ok());
        for (auto& [param, p] : (*model)->TrainableParameters()) {
          grads[param] = p.grad().clone();
          p.mutable_grad() = at::Tensor();
        }
      }
      const auto& [loop_logits, loop_grads] = got[0];
      for (size_t way = 1; way < got.size(); ++way) {
        const auto& [grouped_logits, grouped_grads] = got[way];
        EXPECT_LE((grouped_logits - loop_logits).abs().max().item<double>(), 1e-5) << name << " way " << way;
        for (const auto& [param, want] : loop_grads) {
          const double scale = want.abs().max().item<double>();
          EXPECT_GT(scale, 0) << name << " " << param;
          EXPECT_LE((grouped_grads.at(param) - want).abs().max().item<double>(), 1e-5 * scale)
              << name << " " << param << " way " << way;
        }
      }
    }
  }
}

// TinyModelParityTest is instantiated from the tiny models found: without them its tests would
// vanish rather than skip, so their absence fails here (scripts/fetch_test_data.sh makes them).
TEST(TransformerTest, TinyModelsArePresent) {
  EXPECT_GE(TinyModels().size(), 17u) << "tiny models under " << testing::DataDir()
                                      << "/tiny (scripts/fetch_test_data.sh makes them)";
}

// A mixture of experts' full fine-tuning output is written in its family's checkpoint layout (each
// expert's projections, Mixtral's block_sparse_moe w1/w3/w2; gpt-oss's whole banks [E, in, out]
// with their biases and its router), the names a checkpoint of full fine-tuning restores
// (StoredWeights), and loads back to the same logits. An MXFP4 checkpoint's banks are written
// dequantized, under the banks' names, without its quantization_config.
TEST(TransformerTest, ExpertsSaveInTheirFamilysLayout) {
  for (const std::string name : {"qwen3-moe", "mixtral-window", "gpt-oss", "gpt-oss-mxfp4"}) {
    const std::string dir = testing::DataDir() + "/tiny/" + name;
    if (!fs::exists(dir)) GTEST_SKIP() << "no tiny models";
    auto model = Transformer::Load(testing::OpenDir(dir), at::kFloat, at::kCPU);
    ASSERT_TRUE(model.ok()) << model.status();
    const std::string out = testing::ScratchDir("experts_" + name);
    std::ifstream config(dir + "/config.json");
    const std::string config_json((std::istreambuf_iterator<char>(config)), std::istreambuf_iterator<char>());
    ASSERT_TRUE((*model)->SaveFull(testing::OpenDir(out), config_json).ok());
    auto original = WeightSet::Open(testing::OpenDir(dir));
    auto saved = WeightSet::Open(testing::OpenDir(out));
    ASSERT_TRUE(original.ok() && saved.ok());
    std::vector<std::string> want, got = (*saved)->names(), stored;
    for (const std::string& n : (*original)->names()) {
      if (absl::EndsWith(n, "_scales")) continue;
      want.push_back(absl::EndsWith(n, "_blocks") ? n.substr(0, n.size() - 7) : n);  // MXFP4: the bank
    }
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, want) << name;
    for (const auto& [n, t] : (*model)->StoredWeights()) stored.push_back(n);
    std::sort(stored.begin(), stored.end());
    EXPECT_EQ(stored, want) << name;
    std::ifstream saved_config(out + "/config.json");
    const std::string saved_json((std::istreambuf_iterator<char>(saved_config)), std::istreambuf_iterator<char>());
    EXPECT_EQ(saved_json.find("quantization_config"), std::string::npos) << name;
    EXPECT_EQ(config_json.find("quantization_config") != std::string::npos, name == "gpt-oss-mxfp4");
    auto reloaded = Transformer::Load(testing::OpenDir(out), at::kFloat, at::kCPU);
    ASSERT_TRUE(reloaded.ok()) << reloaded.status();
    auto ref = WeightSet::Open(testing::OpenDir(dir), "reference.safetensors");
    ASSERT_TRUE(ref.ok());
    const ChunkInput in = WholeSequence(ToTensor(*(*ref)->Find("input_ids"), at::kLong)[0]);
    at::NoGradGuard no_grad;
    EXPECT_TRUE(at::equal(WholeSequenceLogits(**model, in), WholeSequenceLogits(**reloaded, in))) << name;
    fs::remove_all(out);
  }
}

// Bad model directories fail with errors naming the problem, never a crash.
TEST(TransformerTest, BadModelDirectories) {
  const std::string src = testing::DataDir() + "/tiny/llama-gqa";
  if (!fs::exists(src)) GTEST_SKIP() << "no tiny models";
  const std::string dir = testing::ScratchDir("bad_model");
  fs::copy(src, dir, fs::copy_options::recursive);

  EXPECT_EQ(FileAccess::Unconfined()->OpenDir(dir + "/missing").status().code(), absl::StatusCode::kNotFound);

  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  auto write_config = [&](const nlohmann::json& j) { std::ofstream(dir + "/config.json") << j.dump(); };

  nlohmann::json bad = cfg;
  bad["model_type"] = "gpt_neox";
  bad["architectures"] = {"GPTNeoXForCausalLM"};
  write_config(bad);
  auto s = Transformer::Load(testing::OpenDir(dir), at::kFloat, at::kCPU).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("GPTNeoXForCausalLM"), std::string::npos) << s;

  bad = cfg;
  bad.erase("hidden_size");
  write_config(bad);
  s = Transformer::Load(testing::OpenDir(dir), at::kFloat, at::kCPU).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("hidden_size"), std::string::npos) << s;

  bad = cfg;
  bad["num_hidden_layers"] = cfg["num_hidden_layers"].get<int>() + 1;  // weights of a layer are missing
  write_config(bad);
  s = Transformer::Load(testing::OpenDir(dir), at::kFloat, at::kCPU).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("missing tensor 'model.layers.2."), std::string::npos) << s;

  bad = cfg;
  bad["num_hidden_layers"] = cfg["num_hidden_layers"].get<int>() - 1;  // a layer's weights are unexpected
  write_config(bad);
  s = Transformer::Load(testing::OpenDir(dir), at::kFloat, at::kCPU).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unexpected tensors"), std::string::npos) << s;

  bad = cfg;
  bad["rope_parameters"] = {{"rope_type", "proportional"}, {"rope_theta", 10000.0}};
  write_config(bad);
  s = Transformer::Load(testing::OpenDir(dir), at::kFloat, at::kCPU).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("proportional"), std::string::npos) << s;

  bad = cfg;  // longrope needs its factors, rotary_dim / 2 of each
  bad["rope_parameters"] = {{"rope_type", "longrope"}, {"rope_theta", 10000.0}};
  write_config(bad);
  s = Transformer::Load(testing::OpenDir(dir), at::kFloat, at::kCPU).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("short_factor"), std::string::npos) << s;
  bad["rope_parameters"]["short_factor"] = {1.0, 2.0};
  bad["rope_parameters"]["long_factor"] = {1.0, 2.0};
  write_config(bad);
  s = Transformer::Load(testing::OpenDir(dir), at::kFloat, at::kCPU).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rotary_dim / 2 = 8 entries, got 2 and 2"), std::string::npos) << s;
  fs::remove_all(dir);
}

// An adapter saved by oomb loads back into oomb with the same weights.
TEST(TransformerTest, LoraRoundTrip) {
  const std::string src = testing::DataDir() + "/tiny/qwen2-bias-gqa-untied";
  if (!fs::exists(src)) GTEST_SKIP() << "no tiny models";
  auto a = Transformer::Load(testing::OpenDir(src), at::kFloat, at::kCPU);
  auto b = Transformer::Load(testing::OpenDir(src), at::kFloat, at::kCPU);
  ASSERT_TRUE(a.ok() && b.ok());
  LoraOptions lora;
  lora.rank = 4;
  lora.target_modules = {"q_proj", "v_proj", "down_proj"};
  ASSERT_TRUE((*a)->AddLora(lora, 1).ok());
  ASSERT_TRUE((*b)->AddLora(lora, 2).ok());
  {
    at::NoGradGuard no_grad;
    for (auto& [name, p] : (*a)->TrainableParameters()) p.normal_();
  }
  const std::string dir = testing::ScratchDir("lora_round_trip");
  ASSERT_TRUE((*a)->SaveLora(testing::OpenDir(dir), src).ok());
  ASSERT_TRUE((*b)->LoadLoraWeights(testing::OpenDir(dir)).ok());
  const auto pa = (*a)->TrainableParameters(), pb = (*b)->TrainableParameters();
  ASSERT_EQ(pa.size(), pb.size());
  EXPECT_EQ(pa.size(), static_cast<size_t>(2 * 3 * (*a)->config().num_layers));  // A and B, 3 modules a layer
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_TRUE(at::equal(pa[i].second, pb[i].second)) << pa[i].first;
  }
  auto cfg = nlohmann::json::parse(std::ifstream(dir + "/adapter_config.json"));
  EXPECT_EQ(cfg["peft_type"], "LORA");
  EXPECT_EQ(cfg["r"], 4);
  // A config whose targets leave some of the file's tensors to no adapter is refused, not read
  // with those tensors dropped.
  cfg["target_modules"] = {"q_proj", "v_proj"};
  std::ofstream(dir + "/adapter_config.json") << cfg.dump();
  auto c = Transformer::Load(testing::OpenDir(src), at::kFloat, at::kCPU);
  ASSERT_TRUE(c.ok());
  const absl::Status dropped = (*c)->LoadAdapter(testing::OpenDir(dir));
  EXPECT_EQ(dropped.code(), absl::StatusCode::kInvalidArgument) << dropped;
  EXPECT_TRUE(absl::StrContains(dropped.message(), "mlp.down_proj.lora_A.weight' belongs to no adapter")) << dropped;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace oomb
