#include "worker/job/model_tools.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "kernels/torch/matmul.h"
#include "worker/common/status.h"
#include "worker/data/dataset.h"
#include "worker/hf/chat_template.h"
#include "worker/hf/layer_spec.h"
#include "worker/hf/safetensors.h"
#include "worker/hf/tokenizer.h"
#include "worker/job/build_info.h"
#include "worker/job/device.h"
#include "worker/job/eval_suites.h"
#include "worker/job/model_loader.h"
#include "worker/model/transformer.h"
#include "worker/session/training_session.h"
#include "worker/train/attention.h"
#include "worker/train/chunk_trainer.h"
#include "worker/train/torch_status.h"

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
  const ModelSpec spec = DescribeModel(c);
  std::vector<std::string> lora_targets;  // the names PEFT adapts
  for (const LinearSpec& l : spec.layers.front().linears) lora_targets.emplace_back(l.name);
  const std::vector<int64_t> windows = spec.Windows();
  nlohmann::json j = {
      {"path", model_dir},
      {"architecture", c.architecture},
      {"model_type", c.model_type},
      {"parameters", spec.ParameterCount(c)},
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
      {"rotary_dim", c.rope_dim()},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"qkv_bias", spec.layers.front().linears.front().bias},
      {"lora_target_modules", lora_targets},
      {"context_window", c.max_position_embeddings},
      {"sliding_window", *std::max_element(windows.begin(), windows.end())},
      {"sliding_window_layers", std::count_if(windows.begin(), windows.end(), [](int64_t w) { return w > 0; })},
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

// The model of `model_dir` in `dtype` ("float32" | "bfloat16") on `device`, with the adapter of
// `adapter_dir` when one is named, loaded as an evaluate job's (worker/job/model_loader.h).
absl::StatusOr<std::unique_ptr<Transformer>> LoadModel(const Dir& model_dir, const std::string& adapter_dir,
                                                       const std::string& dtype, const std::string& device,
                                                       std::optional<RopeScalingOverride> rope) {
  ModelSource source{.model = model_dir, .model_field = "--model", .adapter_field = "--adapter"};
  if (!adapter_dir.empty()) {
    absl::StatusOr<Dir> adapter = FileAccess::Unconfined()->OpenDir(adapter_dir);
    if (!adapter.ok()) return Annotate(adapter.status(), "--adapter");
    source.adapter = *adapter;
  }
  OOMB_ASSIGN_OR_RETURN(const at::Device on, ResolveDevice(device, "--device"));
  return LoadForEvaluation(source, dtype == "bfloat16" ? at::kBFloat16 : at::kFloat, on, std::move(rope));
}

// A model (and adapter) loaded for evaluation, and its evaluate session (EvaluateSession).
struct Evaluator {
  std::unique_ptr<Transformer> model;
  std::unique_ptr<TrainingSession> session;
};

// The session an evaluate job of `model` would run (method.type evaluate): its pages planned by
// the memory planner for sequences up to `longest` tokens on this machine, in chunks of
// `chunk_tokens`.
absl::StatusOr<std::unique_ptr<TrainingSession>> EvaluateSession(Transformer& model, const std::string& dtype,
                                                                 int64_t chunk_tokens, int64_t longest) {
  JobConfig job;
  job.method.type = TrainMethod::kEvaluate;
  job.model.dtype = dtype == "bfloat16" ? ModelDtype::kBFloat16 : ModelDtype::kFloat32;
  job.memory.chunk_tokens = chunk_tokens;
  job.data.max_seq_len = longest;
  SessionOptions session;
  session.device = model.device();
  session.machine = ThisMachine(session.device.is_cuda() ? session.device.str() : "cpu");
  session.longest_sequence = longest;
  return TrainingSession::Create(&model, job, std::move(session));
}

absl::StatusOr<Evaluator> MakeEvaluator(const EvalOptions& o, const Dir& model_dir, int64_t longest) {
  Evaluator e;
  OOMB_ASSIGN_OR_RETURN(e.model, LoadModel(model_dir, o.adapter_dir, o.dtype, o.device, o.rope_scaling));
  OOMB_ASSIGN_OR_RETURN(e.session, EvaluateSession(*e.model, o.dtype, o.chunk_tokens, longest));
  return e;
}

// `r`, its error prefixed with `flag`.
template <typename T>
absl::StatusOr<T> Annotated(absl::StatusOr<T> r, const char* flag) {
  if (!r.ok()) return Annotate(r.status(), flag);
  return r;
}

bool Wants(const EvalOptions& o, EvalSuite suite) {
  return std::find(o.suites.begin(), o.suites.end(), suite) != o.suites.end();
}

// The data's samples, cut after max_tokens tokens in all.
absl::StatusOr<std::vector<Document>> ReadSamples(const EvalOptions& o, const Dir& model_dir,
                                                  ModelTokenizer& tokenizer) {
  const std::shared_ptr<const FileAccess> files = FileAccess::Unconfined();
  DatasetOptions d;
  d.field = "--data";
  d.max_seq_len = int64_t{1} << 31;
  OOMB_ASSIGN_OR_RETURN(d.vocab_size, ModelVocabSize(model_dir));
  OOMB_ASSIGN_OR_RETURN(const File data, files->OpenFile(o.data_path));
  OOMB_ASSIGN_OR_RETURN(std::vector<Document> docs, ReadJsonlDataset(data, tokenizer.Loader(), d, nullptr));
  int64_t budget = o.max_tokens > 0 ? o.max_tokens : std::numeric_limits<int64_t>::max();
  std::vector<Document> kept;
  for (Document& doc : docs) {
    if (budget <= 0) break;
    if (static_cast<int64_t>(doc.ids.size()) > budget) {
      doc.ids.resize(budget);
      doc.labels.resize(budget);
    }
    budget -= static_cast<int64_t>(doc.ids.size());
    kept.push_back(std::move(doc));
  }
  return kept;
}

// The suites' inputs: --data's samples (the loss, positions), the model's tokenizer (passkey,
// needle) and the haystack's text (needle).
absl::StatusOr<SuiteInputs> EvalInputs(const EvalOptions& o, const Dir& model_dir,
                                       std::unique_ptr<Tokenizer>* tokenizer) {
  SuiteInputs in;
  in.retrieval = {o.lengths, o.depths, o.trials, o.seed};
  if (o.loss || Wants(o, EvalSuite::kPositions)) {
    if (o.data_path.empty()) return absl::InvalidArgumentError("--data: required by the loss and positions suites");
    ModelTokenizer data_tokenizer(model_dir, "--model");
    OOMB_ASSIGN_OR_RETURN(in.samples, ReadSamples(o, model_dir, data_tokenizer));
  }
  if (Wants(o, EvalSuite::kPasskey) || Wants(o, EvalSuite::kNeedle)) {
    OOMB_ASSIGN_OR_RETURN(*tokenizer, Tokenizer::FromModelDir(model_dir));
    in.tokenizer = tokenizer->get();
  }
  if (Wants(o, EvalSuite::kNeedle)) {
    if (o.haystack.empty()) return absl::InvalidArgumentError("--haystack: required by the needle suite");
    OOMB_ASSIGN_OR_RETURN(in.haystack, Annotated(FileAccess::Unconfined()->ReadFile(o.haystack), "--haystack"));
  }
  return in;
}

// The mean loss over `samples`, each its own sequence: from the positions suite's buckets when
// it ran (they cover every position), else a forward of its own.
absl::Status ScoreLoss(ChunkTrainer& trainer, const std::vector<Document>& samples, EvalResult* r) {
  r->samples = static_cast<int64_t>(samples.size());
  double loss_sum = 0;
  if (const auto p = r->suites.find(EvalSuite::kPositions); p != r->suites.end()) {
    for (const PositionLoss& b : p->second.buckets) {
      loss_sum += b.loss * static_cast<double>(b.tokens);
      r->tokens += b.tokens;
    }
  } else {
    std::vector<TokenSequence> seqs(samples.size());
    for (size_t i = 0; i < samples.size(); ++i) seqs[i].Append(samples[i]);
    OOMB_ASSIGN_OR_RETURN(const DataScore d, ScoreData(trainer, seqs, /*by_position=*/false));
    loss_sum = d.loss_sum;
    r->tokens = d.tokens;
  }
  r->mean_loss = r->tokens > 0 ? loss_sum / static_cast<double>(r->tokens) : 0.0;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<EvalResult> EvaluateModel(const EvalOptions& o) {
  return Guarded(
      [&]() -> absl::StatusOr<EvalResult> {
        OOMB_ASSIGN_OR_RETURN(const Dir model_dir, FileAccess::Unconfined()->OpenDir(o.model_dir));
        std::unique_ptr<Tokenizer> tokenizer;
        OOMB_ASSIGN_OR_RETURN(const SuiteInputs inputs, EvalInputs(o, model_dir, &tokenizer));
        std::vector<std::pair<EvalSuite, std::unique_ptr<Suite>>> suites;
        int64_t longest = 1;
        for (const Document& d : inputs.samples) longest = std::max(longest, static_cast<int64_t>(d.ids.size()));
        for (const EvalSuite suite : o.suites) {
          OOMB_ASSIGN_OR_RETURN(
              std::unique_ptr<Suite> made,
              Annotated(MakeSuite(suite, inputs), suite == EvalSuite::kNeedle ? "--haystack" : "--lengths"));
          longest = std::max(longest, made->longest());
          suites.emplace_back(suite, std::move(made));
        }
        OOMB_ASSIGN_OR_RETURN(Evaluator e, MakeEvaluator(o, model_dir, longest));
        EvalResult r;
        for (const auto& [suite, s] : suites) {
          OOMB_ASSIGN_OR_RETURN(r.suites[suite], s->Score(e.session->trainer()));
        }
        if (o.loss) OOMB_RETURN_IF_ERROR(ScoreLoss(e.session->trainer(), inputs.samples, &r));
        return r;
      },
      "evaluation");
}

namespace {

// One sequence run forward a span at a time over the session's KV pages, as training's stage 1
// runs its chunks: each span attends over the tokens before it, read from the KV store by the
// dense attention strategy (worker/train/attention.h), and appends its own keys and values.
// Sliding-window layers keep the pages some later token still reads (a span may start at any
// token).
class PagedSequence {
 public:
  PagedSequence(const Transformer& model, const TrainingSession& session, int64_t chunk_tokens)
      : model_(model),
        store_(session.pools().pools(), model.config().num_layers,
               PastReach{.windows = model.spec().Windows(), .chunk_tokens = 1}),
        attention_(MakeAttention(&model, session.pools().pools(), Options(chunk_tokens))) {}

  int64_t length() const { return length_; }

  // Tokens [length(), end) of `ids` (dynamic NTK's sequence length: `rope_len`, as transformers
  // uses the prompt's length for its tokens and then the length so far); the greedy next token
  // after them.
  absl::StatusOr<int64_t> Forward(const std::vector<int64_t>& ids, int64_t end, int64_t rope_len) {
    const at::Device device = model_.device();
    Chunk c;
    c.begin = length_;
    c.end = end;
    c.doc_start_host = at::zeros({end - c.begin}, at::kLong);  // one document
    c.input.ids = at::tensor(std::vector<int64_t>(ids.begin() + c.begin, ids.begin() + end), at::kLong).to(device);
    c.input.positions = at::arange(c.begin, end, at::TensorOptions().dtype(at::kLong).device(device));
    c.input.doc_start = c.doc_start_host.to(device);
    c.input.rope_seq_len = rope_len;
    const at::Tensor hidden =
        model_.Hidden(c.input, [&](int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
          absl::StatusOr<at::Tensor> out = attention_->Forward(c, layer, q, k, v, nullptr, store_);
          if (!out.ok()) throw StatusError(out.status());
          return *out;
        });
    length_ = end;
    return kernels::Matmul(hidden[end - c.begin - 1], model_.lm_head().t()).argmax().item<int64_t>();
  }

 private:
  static ChunkTrainerOptions Options(int64_t chunk_tokens) {
    ChunkTrainerOptions o;
    o.chunk_tokens = chunk_tokens;
    return o;
  }

  const Transformer& model_;
  KvStore store_;
  std::unique_ptr<Attention> attention_;
  int64_t length_ = 0;
};

}  // namespace

absl::StatusOr<GenerateResult> GreedyGenerate(const GenerateOptions& o) {
  return Guarded(
      [&]() -> absl::StatusOr<GenerateResult> {
        if (o.prompt.empty() == o.prompt_file.empty())
          return absl::InvalidArgumentError("--prompt / --prompt-file: give exactly one");
        if (o.max_new_tokens < 1) return absl::InvalidArgumentError("--max-new-tokens: must be >= 1");
        if (o.prefill_chunk_tokens < 1) return absl::InvalidArgumentError("--chunk-tokens: must be >= 1");
        OOMB_ASSIGN_OR_RETURN(const Dir dir, FileAccess::Unconfined()->OpenDir(o.model_dir));
        OOMB_ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::FromModelDir(dir));
        std::string prompt = o.prompt;
        if (!o.prompt_file.empty()) {
          OOMB_ASSIGN_OR_RETURN(prompt, FileAccess::Unconfined()->ReadFile(o.prompt_file));
        }
        GenerateResult r;
        // As transformers encodes a prompt: with the template's special tokens (Gemma's <bos>).
        OOMB_ASSIGN_OR_RETURN(r.prompt_ids, tokenizer->EncodeChecked(prompt, /*add_special_tokens=*/true));
        if (r.prompt_ids.empty()) return absl::InvalidArgumentError("--prompt: no tokens");
        OOMB_ASSIGN_OR_RETURN(auto model, LoadModel(dir, o.adapter_dir, o.dtype, o.device, o.rope_scaling));
        std::vector<int64_t> ids(r.prompt_ids.begin(), r.prompt_ids.end());
        const int64_t prompt_tokens = static_cast<int64_t>(ids.size());
        // Pages for every token: an evaluate plan leaves out a sequence's last chunk, which no
        // later chunk reads, but every span of a generation is read by the next.
        OOMB_ASSIGN_OR_RETURN(auto session, EvaluateSession(*model, o.dtype, o.prefill_chunk_tokens,
                                                            prompt_tokens + o.max_new_tokens + o.prefill_chunk_tokens));
        at::NoGradGuard no_grad;
        PagedSequence sequence(*model, *session, o.prefill_chunk_tokens);
        int64_t next = 0;
        for (int64_t begin = 0; begin < prompt_tokens; begin += o.prefill_chunk_tokens) {
          const int64_t end = std::min(prompt_tokens, begin + o.prefill_chunk_tokens);
          OOMB_ASSIGN_OR_RETURN(next, sequence.Forward(ids, end, prompt_tokens));
          if (o.on_prefill) o.on_prefill(end, prompt_tokens);
        }
        while (true) {
          r.new_ids.push_back(static_cast<int32_t>(next));
          ids.push_back(next);
          const bool eos = tokenizer->eos_id().has_value() && next == *tokenizer->eos_id();
          if (eos || static_cast<int64_t>(r.new_ids.size()) == o.max_new_tokens) break;
          OOMB_ASSIGN_OR_RETURN(next, sequence.Forward(ids, sequence.length() + 1, sequence.length() + 1));
        }
        OOMB_ASSIGN_OR_RETURN(r.text, tokenizer->Decode(r.new_ids));
        return r;
      },
      "generation");
}

}  // namespace oomb
