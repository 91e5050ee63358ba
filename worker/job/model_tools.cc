#include "worker/job/model_tools.h"

#include <ATen/ATen.h>

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "worker/common/checkpoint_dir.h"
#include "worker/common/status.h"
#include "worker/data/dataset.h"
#include "worker/hf/chat_template.h"
#include "worker/hf/layer_spec.h"
#include "worker/hf/safetensors.h"
#include "worker/hf/tokenizer.h"
#include "worker/job/build_info.h"
#include "worker/job/device.h"
#include "worker/job/executor.h"
#include "worker/job/model_loader.h"
#include "worker/job/ruler.h"
#include "worker/model/transformer.h"
#include "worker/session/training_session.h"
#include "worker/train/chunk_trainer.h"
#include "worker/train/greedy_decoder.h"
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
  for (const LinearSpec& l : LinearLayers(c)) lora_targets.emplace_back(l.name);
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
  if (c.moe.experts > 0) {
    int64_t active = spec.ParameterCount(c);
    for (const LayerSpec& l : spec.layers) active -= l.Parameters() - l.ActiveParameters();
    std::vector<std::string> banks;
    for (const auto& [bank, parts] : ExpertBankParts(c)) {
      if (std::find(banks.begin(), banks.end(), "mlp.experts." + bank) == banks.end())
        banks.push_back("mlp.experts." + bank);
    }
    j["experts"] = {{"experts", c.moe.experts},
                    {"per_token", c.moe.top_k},
                    {"intermediate_size", c.moe.intermediate},
                    {"renormalize", c.moe.renormalize},
                    {"sparse_layers", std::count(c.moe.layers.begin(), c.moe.layers.end(), true)},
                    {"active_parameters", active},
                    {"lora_target_parameters", banks}};
  }
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
  OOMB_ASSIGN_OR_RETURN(const ComputeDevice on, ResolveDevice(device, "--device"));
  return LoadForEvaluation(
      source, dtype == "bfloat16" ? at::kBFloat16 : at::kFloat,
      on.cuda ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(on.index)) : at::Device(at::kCPU), std::move(rope));
}

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

// The evaluate job `oombd model eval` runs: its flags as the spec's fields. Samples are scored
// one sequence each (no packing, no length limit), and the pages are the planner's for the
// longest.
JobConfig EvaluateJob(const EvalOptions& o) {
  JobConfig job;
  job.display_name = "oombd model eval";
  job.model.path = o.model_dir;
  job.model.dtype = o.dtype == "bfloat16" ? ModelDtype::kBFloat16 : ModelDtype::kFloat32;
  job.model.rope_scaling = o.rope_scaling;
  job.method.type = TrainMethod::kEvaluate;
  job.method.lora.init_adapter = o.adapter_dir;
  const bool positions = std::find(o.suites.begin(), o.suites.end(), EvalSuite::kPositions) != o.suites.end();
  if (o.loss || positions) job.data.validation = o.data_path;
  job.data.max_seq_len = int64_t{1} << 31;  // the spec's largest: no sample is cut
  job.data.packing = false;
  job.data.validation_max_tokens = o.max_tokens;
  job.memory.chunk_tokens = o.chunk_tokens;
  job.checkpoint.every_steps = 0;
  job.resources.device = o.device;
  job.evaluation = {.suites = o.suites,
                    .every_steps = 0,
                    .lengths = o.lengths,
                    .depths = o.depths,
                    .trials = o.trials,
                    .seed = o.seed,
                    .haystack = o.haystack,
                    .ruler_tasks = o.ruler_tasks,
                    .ruler_samples = o.ruler_samples,
                    .ruler_threshold = o.ruler_threshold};
  return job;
}

// `s` with the spec's field names in its message replaced by the command's flags.
absl::Status NamingFlags(const absl::Status& s) {
  const std::string message = absl::StrReplaceAll(s.message(), {{"model.path", "--model"},
                                                                {"method.lora.init_adapter", "--adapter"},
                                                                {"data.validation", "--data"},
                                                                {"evaluation.haystack", "--haystack"},
                                                                {"evaluation.lengths", "--lengths"},
                                                                {"resources.device", "--device"},
                                                                {"memory.chunk_tokens", "--chunk-tokens"}});
  absl::Status out(s.code(), message);
  s.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

// A fresh directory for the job's metrics.jsonl, removed with this object.
class ScratchDir {
 public:
  static absl::StatusOr<ScratchDir> Make() {
    std::string path = (std::filesystem::temp_directory_path() / "oomb-eval-XXXXXX").string();
    if (::mkdtemp(path.data()) == nullptr) return ErrnoStatus(errno, "mkdtemp", path);
    return ScratchDir(std::move(path));
  }
  ScratchDir(ScratchDir&& other) noexcept : path_(std::exchange(other.path_, "")) {}
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ScratchDir& operator=(ScratchDir&&) = delete;
  ~ScratchDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace

absl::StatusOr<EvalResult> EvaluateModel(const EvalOptions& o) {
  const bool positions = std::find(o.suites.begin(), o.suites.end(), EvalSuite::kPositions) != o.suites.end();
  if ((o.loss || positions) && o.data_path.empty()) {
    return absl::InvalidArgumentError("--data: required by the loss and positions suites");
  }
  if (std::find(o.suites.begin(), o.suites.end(), EvalSuite::kNeedle) != o.suites.end() && o.haystack.empty()) {
    return absl::InvalidArgumentError("--haystack: required by the needle suite");
  }
  if (std::find(o.suites.begin(), o.suites.end(), EvalSuite::kRuler) != o.suites.end() && o.haystack.empty() &&
      RulerNeedsHaystack(o.ruler_tasks)) {
    return absl::InvalidArgumentError(
        "--haystack: required by the ruler suite's essay tasks (niah_single_2, _3, niah_multikey_1, niah_multivalue, "
        "niah_multiquery; or name --tasks without them)");
  }
  OOMB_ASSIGN_OR_RETURN(ScratchDir scratch, ScratchDir::Make());
  RunOptions run;
  run.files = FileAccess::Unconfined();
  OOMB_ASSIGN_OR_RETURN(run.checkpoint_dir, ClaimCheckpointDir(*run.files, scratch.path(), "oombd-model-eval"));
  std::optional<StepReport> report;
  run.on_step = [&](const StepReport& r) { report = r; };
  run.on_warning = o.on_warning;
  const absl::StatusOr<RunResult> ran = RunJob(EvaluateJob(o), run);
  if (!ran.ok()) return NamingFlags(ran.status());
  if (!report.has_value()) return absl::InternalError("the evaluate job reported nothing");
  EvalResult r;
  if (o.loss) {
    r.mean_loss = report->eval_loss;
    r.tokens = report->eval_tokens;
    r.samples = report->eval_samples;
  }
  if (report->evaluation.has_value()) r.suites = *std::move(report->evaluation);
  return r;
}

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
        GreedyDecoder decoder(*model, session->pools().pools(), o.prefill_chunk_tokens);
        std::optional<int64_t> stop;
        if (tokenizer->eos_id().has_value()) stop = *tokenizer->eos_id();
        OOMB_ASSIGN_OR_RETURN(const std::vector<int64_t> generated,
                              decoder.Continue(ids, o.max_new_tokens, stop, o.on_prefill));
        r.new_ids.assign(generated.begin(), generated.end());
        OOMB_ASSIGN_OR_RETURN(r.text, tokenizer->Decode(r.new_ids));
        return r;
      },
      "generation");
}

}  // namespace oomb
