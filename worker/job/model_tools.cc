#include "worker/job/model_tools.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "kernels/torch/paged_attention.h"
#include "worker/common/status.h"
#include "worker/data/dataset.h"
#include "worker/hf/chat_template.h"
#include "worker/hf/loading_code.h"
#include "worker/hf/safetensors.h"
#include "worker/hf/tokenizer.h"
#include "worker/job/eval_suites.h"
#include "worker/kv/page_pool.h"
#include "worker/model/transformer.h"
#include "worker/train/chunk_trainer.h"

namespace oomb {

absl::StatusOr<std::string> InspectModel(const std::string& model_dir) {
  OOMB_ASSIGN_OR_RETURN(const Dir dir, FileAccess::Unconfined()->OpenDir(model_dir));
  OOMB_ASSIGN_OR_RETURN(ModelConfig c, LoadModelConfig(dir));
  OOMB_ASSIGN_OR_RETURN(auto weights, WeightSet::Open(dir));
  std::set<std::string> dtypes;
  int64_t stored = 0;
  for (const std::string& n : weights->names()) {
    const TensorView* v = weights->Find(n);
    dtypes.insert(std::string(DTypeName(v->dtype)));
    stored += NumElements(v->shape);
  }
  nlohmann::json j = {
      {"path", model_dir},
      {"architecture", c.architecture},
      {"model_type", c.model_type},
      {"parameters", c.ParameterCount()},
      {"stored_parameters", stored},
      {"dtypes", dtypes},
      {"config_dtype", c.torch_dtype},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_layers", c.num_layers},
      {"num_heads", c.num_heads},
      {"num_kv_heads", c.num_kv_heads},
      {"head_dim", c.head_dim},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"qkv_bias", c.qkv_bias},
      {"context_window", c.max_position_embeddings},
      {"rope", {{"type", RopeTypeName(c.rope.type)}, {"theta", c.rope.theta}, {"factor", c.rope.factor}}},
      {"kv_bytes_per_token_bf16", 2 * c.num_layers * c.kv_dim() * 2}};
  auto tok = Tokenizer::FromModelDir(dir);
  if (tok.ok()) {
    j["tokenizer"] = {{"vocab_size", (*tok)->vocab_size()}, {"chat_template", !(*tok)->chat_template().empty()}};
  } else {
    j["tokenizer"] = {{"error", std::string(tok.status().message())}};
  }
  return j.dump(2);
}

namespace {

// The RoPE scaling an adapter was trained with, from the base config recorded beside it
// (kBaseConfigFile); none for an adapter without one.
absl::StatusOr<std::optional<RopeScalingOverride>> TrainedRopeScaling(const Dir& adapter) {
  if (!adapter.Contains(kBaseConfigFile)) return std::optional<RopeScalingOverride>();
  OOMB_ASSIGN_OR_RETURN(const std::string text, adapter.ReadFile(kBaseConfigFile, int64_t{1} << 20));
  OOMB_ASSIGN_OR_RETURN(const ModelConfig trained, ParseModelConfig(text, adapter.PathOf(kBaseConfigFile)));
  return RopeScalingOf(trained.rope);
}

}  // namespace

namespace {

// A model (and adapter) loaded for evaluation, with pools for sequences up to `longest` tokens.
struct Evaluator {
  std::unique_ptr<Transformer> model;
  std::unique_ptr<PagePool> kv, grad;
  std::unique_ptr<ChunkTrainer> trainer;
};

absl::StatusOr<Evaluator> MakeEvaluator(const EvalOptions& o, const Dir& model_dir, int64_t longest) {
  const bool cuda = torch::cuda::is_available();
  const at::Device device =
      o.device == "cpu" || (o.device == "auto" && !cuda) ? at::Device(at::kCPU) : at::Device(at::kCUDA, 0);
  const at::ScalarType dtype = o.dtype == "bfloat16" ? at::kBFloat16 : at::kFloat;
  std::optional<Dir> adapter;
  std::optional<RopeScalingOverride> rope;
  if (!o.adapter_dir.empty()) {
    OOMB_ASSIGN_OR_RETURN(adapter, FileAccess::Unconfined()->OpenDir(o.adapter_dir));
    OOMB_ASSIGN_OR_RETURN(rope, TrainedRopeScaling(*adapter));
  }
  Evaluator e;
  OOMB_ASSIGN_OR_RETURN(e.model, Transformer::Load(model_dir, dtype, device, rope));
  if (adapter.has_value()) {
    OOMB_ASSIGN_OR_RETURN(std::string text, adapter->ReadFile("adapter_config.json"));
    const auto cfg = nlohmann::json::parse(text, nullptr, false);
    if (!cfg.is_object()) return absl::InvalidArgumentError(o.adapter_dir + "/adapter_config.json: not JSON");
    LoraOptions lora;
    lora.rank = cfg.value("r", 8);
    lora.alpha = cfg.value("lora_alpha", 8.0);
    lora.target_modules = cfg.value("target_modules", std::vector<std::string>{});
    OOMB_RETURN_IF_ERROR(e.model->AddLora(lora, 0));
    OOMB_RETURN_IF_ERROR(e.model->LoadLoraWeights(*adapter));
  }
  const ModelConfig& c = e.model->config();
  const int64_t P = 128, pages = c.num_layers * ((longest + P - 1) / P + 1);
  const PageShape shape{c.num_kv_heads, P, c.head_dim};
  OOMB_ASSIGN_OR_RETURN(e.kv, PagePool::Create(PageKind::kKv, Tier::kDevice, shape,
                                               at::TensorOptions().dtype(dtype).device(device), pages));
  OOMB_ASSIGN_OR_RETURN(e.grad, PagePool::Create(PageKind::kKvGrad, Tier::kDevice, shape,
                                                 at::TensorOptions().dtype(at::kFloat).device(device), 0));
  ChunkTrainerOptions options;
  options.chunk_tokens = o.chunk_tokens;
  e.trainer = std::make_unique<ChunkTrainer>(e.model.get(), e.kv.get(), e.grad.get(), options);
  return e;
}

// `r`, its error prefixed with `flag`.
template <typename T>
absl::StatusOr<T> Annotated(absl::StatusOr<T> r, const char* flag) {
  if (!r.ok()) return Annotate(r.status(), flag);
  return r;
}

bool Wants(const EvalOptions& o, const char* suite) {
  return std::find(o.suites.begin(), o.suites.end(), suite) != o.suites.end();
}

// The data's samples, each its own sequence, cut after max_tokens tokens in all.
absl::StatusOr<std::vector<TokenSequence>> ReadSamples(const EvalOptions& o, const Dir& model_dir,
                                                       ModelTokenizer& tokenizer) {
  const std::shared_ptr<const FileAccess> files = FileAccess::Unconfined();
  DatasetOptions d;
  d.field = "--data";
  d.max_seq_len = int64_t{1} << 31;
  OOMB_ASSIGN_OR_RETURN(d.vocab_size, ModelVocabSize(model_dir));
  OOMB_ASSIGN_OR_RETURN(const File data, files->OpenFile(o.data_path));
  OOMB_ASSIGN_OR_RETURN(std::vector<Document> docs, ReadJsonlDataset(data, tokenizer.Loader(), d, nullptr));
  int64_t budget = o.max_tokens > 0 ? o.max_tokens : std::numeric_limits<int64_t>::max();
  std::vector<TokenSequence> seqs;
  for (Document& doc : docs) {
    if (budget <= 0) break;
    if (static_cast<int64_t>(doc.ids.size()) > budget) {
      doc.ids.resize(budget);
      doc.labels.resize(budget);
    }
    budget -= static_cast<int64_t>(doc.ids.size());
    TokenSequence s;
    s.Append(doc);
    seqs.push_back(std::move(s));
  }
  return seqs;
}

}  // namespace

absl::StatusOr<EvalResult> EvaluateModel(const EvalOptions& o) {
  try {
    for (const std::string& s : o.suites) {
      if (s != "loss" && s != "positions" && s != "passkey" && s != "needle") {
        return absl::InvalidArgumentError(
            absl::StrCat("--suite: unknown suite '", s, "' (loss, positions, passkey, needle)"));
      }
    }
    const bool on_data = Wants(o, "loss") || Wants(o, "positions");
    if (on_data && o.data_path.empty())
      return absl::InvalidArgumentError("--data: required by the loss and positions suites");
    if (Wants(o, "needle") && o.haystack.empty())
      return absl::InvalidArgumentError("--haystack: required by the needle suite");
    OOMB_ASSIGN_OR_RETURN(const Dir model_dir, FileAccess::Unconfined()->OpenDir(o.model_dir));
    ModelTokenizer tokenizer(model_dir, "--model");
    std::vector<TokenSequence> seqs;
    if (on_data) {
      OOMB_ASSIGN_OR_RETURN(seqs, ReadSamples(o, model_dir, tokenizer));
    }
    RetrievalOptions ro{o.lengths, o.depths, o.trials, o.seed};
    std::vector<RetrievalDoc> passkey, needle;
    if (Wants(o, "passkey") || Wants(o, "needle")) {
      OOMB_ASSIGN_OR_RETURN(const std::unique_ptr<Tokenizer> tok, Tokenizer::FromModelDir(model_dir));
      if (Wants(o, "passkey")) {
        OOMB_ASSIGN_OR_RETURN(passkey, Annotated(PasskeyDocs(*tok, ro), "--lengths"));
      }
      if (Wants(o, "needle")) {
        OOMB_ASSIGN_OR_RETURN(const std::string text, FileAccess::Unconfined()->ReadFile(o.haystack));
        OOMB_ASSIGN_OR_RETURN(needle, Annotated(NeedleDocs(*tok, text, ro), "--haystack"));
      }
    }
    int64_t longest = 1;
    for (const TokenSequence& s : seqs) longest = std::max(longest, s.size());
    for (const int64_t l : o.lengths) longest = std::max(longest, l);
    OOMB_ASSIGN_OR_RETURN(Evaluator e, MakeEvaluator(o, model_dir, longest));
    EvalResult r;
    if (on_data) {
      OOMB_ASSIGN_OR_RETURN(DataScore d, ScoreData(*e.trainer, seqs, Wants(o, "positions")));
      r.mean_loss = d.tokens > 0 ? d.loss_sum / static_cast<double>(d.tokens) : 0.0;
      r.tokens = d.tokens;
      r.samples = d.samples;
      r.suites.positions = std::move(d.positions);
    }
    if (!passkey.empty()) {
      OOMB_ASSIGN_OR_RETURN(r.suites.passkey, ScoreRetrieval(*e.trainer, passkey));
    }
    if (!needle.empty()) {
      OOMB_ASSIGN_OR_RETURN(r.suites.needle, ScoreRetrieval(*e.trainer, needle));
    }
    return r;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("evaluation: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<GenerateResult> GreedyGenerate(const std::string& model_dir, const std::string& prompt,
                                              int64_t max_new_tokens) {
  try {
    const at::Device device = torch::cuda::is_available() ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
    OOMB_ASSIGN_OR_RETURN(const Dir dir, FileAccess::Unconfined()->OpenDir(model_dir));
    OOMB_ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::FromModelDir(dir));
    OOMB_ASSIGN_OR_RETURN(auto model, Transformer::Load(dir, at::kFloat, device));
    GenerateResult r;
    OOMB_ASSIGN_OR_RETURN(r.prompt_ids, tokenizer->EncodeChecked(prompt));
    std::vector<int64_t> ids(r.prompt_ids.begin(), r.prompt_ids.end());
    at::NoGradGuard no_grad;
    for (int64_t step = 0; step < max_new_tokens; ++step) {
      const int64_t T = static_cast<int64_t>(ids.size());
      ChunkInput in;
      in.ids = at::tensor(ids, at::kLong).to(device);
      in.positions = at::arange(T, at::TensorOptions().dtype(at::kLong).device(device));
      in.doc_start = at::zeros({T}, at::TensorOptions().dtype(at::kLong).device(device));
      in.rope_seq_len = T;
      const at::Tensor hidden =
          model->Hidden(in, [&](int64_t, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
            return kernels::PagedAttention(q, k, v, in.doc_start, nullptr);
          });
      const int64_t next = at::matmul(hidden[T - 1], model->lm_head().t()).argmax().item<int64_t>();
      r.new_ids.push_back(static_cast<int32_t>(next));
      ids.push_back(next);
      if (tokenizer->eos_id().has_value() && next == *tokenizer->eos_id()) break;
    }
    OOMB_ASSIGN_OR_RETURN(r.text, tokenizer->Decode(r.new_ids));
    return r;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("generation: ", e.what_without_backtrace()));
  }
}

}  // namespace oomb
