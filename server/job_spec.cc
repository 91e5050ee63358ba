#include "server/job_spec.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

// The ruler section: known tasks, each once, and the haystack its essay tasks need.
absl::Status CheckRuler(const v1::JobSpec& s, const spec::Source& source, const spec::Lines* lines) {
  const v1::EvaluationSpec& e = s.evaluation();
  const auto& tasks = e.ruler().tasks();
  std::vector<RulerTask> named;
  for (int i = 0; i < tasks.size(); ++i) {
    const std::string name = v1::Evaluation::RulerTask_Name(tasks[i]);
    const std::optional<RulerTask> task = RulerTaskNamed(name);
    if (!task.has_value()) {
      return spec::FieldError(source, lines, "evaluation.ruler.tasks",
                              absl::StrCat("unknown task ", tasks[i], " (", RulerTaskNames(), ")"));
    }
    if (std::find(named.begin(), named.end(), *task) != named.end()) {
      return spec::FieldError(source, lines, "evaluation.ruler.tasks", absl::StrCat("'", name, "' is listed twice"));
    }
    named.push_back(*task);
  }
  const bool ruler = std::find(e.suites().begin(), e.suites().end(), v1::Evaluation::ruler) != e.suites().end();
  if (ruler && e.haystack().empty() && RulerNeedsHaystack(named)) {
    return spec::FieldError(source, lines, "evaluation.haystack",
                            "required by the ruler suite's essay tasks (niah_single_2, _3, niah_multikey_1, "
                            "niah_multivalue, niah_multiquery): a UTF-8 text, or list evaluation.ruler.tasks "
                            "without them");
  }
  return absl::OkStatus();
}

// The evaluation section against the rest of the spec: known suites, and each suite's input.
absl::Status CheckEvaluation(const v1::JobSpec& s, const spec::Source& source, const spec::Lines* lines) {
  const auto error = [&](const std::string& path, absl::string_view what) {
    return spec::FieldError(source, lines, path, what);
  };
  const v1::EvaluationSpec& e = s.evaluation();
  for (int i = 0; i < e.suites_size(); ++i) {
    const std::string name = v1::Evaluation::Suite_Name(e.suites(i));
    if (!SuiteNamed(name).has_value()) {
      return error("evaluation.suites", absl::StrCat("unknown suite ", e.suites(i), " (", SuiteNames(), ")"));
    }
    if (std::find(e.suites().begin(), e.suites().begin() + i, e.suites(i)) != e.suites().begin() + i) {
      return error("evaluation.suites", absl::StrCat("'", name, "' is listed twice"));
    }
    if (e.suites(i) == v1::Evaluation::positions && s.data().validation().empty()) {
      return error("evaluation.suites", "positions scores data.validation: set it");
    }
    if (e.suites(i) == v1::Evaluation::needle && e.haystack().empty()) {
      return error("evaluation.haystack", "required by the needle suite (a UTF-8 text to hide the fact in)");
    }
  }
  OOMB_RETURN_IF_ERROR(CheckRuler(s, source, lines));
  for (const int64_t length : e.lengths()) {
    if (length > s.data().max_seq_len()) {
      return error("evaluation.lengths", absl::StrCat("each must be at most data.max_seq_len (", s.data().max_seq_len(),
                                                      ": the pages are planned for it), got ", length));
    }
  }
  return absl::OkStatus();
}

// What the method reads: training data, or (evaluate) something to evaluate and no training data.
absl::Status CheckMethod(const v1::JobSpec& s, const spec::Source& source, const spec::Lines* lines) {
  const auto error = [&](const std::string& path, absl::string_view what) {
    return spec::FieldError(source, lines, path, what);
  };
  if (s.method().type() != v1::Method::evaluate) {
    if (s.data().train().empty()) return error("data.train", "is required (the training data)");
    return absl::OkStatus();
  }
  if (!s.data().train().empty()) {
    return error("data.train", "method.type evaluate trains nothing: remove data.train (it would not be read)");
  }
  if (s.evaluation().suites().empty() && s.data().validation().empty()) {
    return error("evaluation.suites",
                 "method.type evaluate needs something to evaluate: evaluation.suites, data.validation or both");
  }
  if (s.resources().gpus() > 1) {
    return error("resources.gpus", absl::StrCat("method.type evaluate runs on one device, got ", s.resources().gpus()));
  }
  return absl::OkStatus();
}

// The keys a query tile of sparse attention attends when attention.sparse.page_budget is auto.
constexpr int64_t kAutoSparseKeys = 8192;

// Resolves memory.page_tokens and attention.sparse.page_budget left auto (0) in `s`, and says
// what was chosen (for fields a sparse job reads) and why.
std::vector<std::string> ResolveAutoPages(v1::JobSpec* s) {
  std::vector<std::string> choices;
  const bool sparse = s->attention().mode() == v1::Attention::sparse;
  v1::MemorySpec& m = *s->mutable_memory();
  if (m.page_tokens() == 0) {
    m.set_page_tokens(sparse ? 256 : 128);
    if (sparse) {
      choices.push_back(
          "memory.page_tokens auto: 256 with attention.mode sparse (half the pages of 128 to summarize, select "
          "and move for the same keys; 128 with dense attention)");
    }
  }
  v1::SparseAttentionSpec& sp = *s->mutable_attention()->mutable_sparse();
  if (sp.page_budget() == 0) {
    sp.set_page_budget(std::max(kAutoSparseKeys / m.page_tokens(), sp.sink_pages() + sp.local_pages()));
    if (sparse) {
      choices.push_back(absl::StrCat("attention.sparse.page_budget auto: ", sp.page_budget(), " pages of ",
                                     m.page_tokens(), " tokens (", kAutoSparseKeys,
                                     " keys a query tile, at least sink_pages + local_pages)"));
    }
  }
  return choices;
}

absl::Status CheckRelations(const v1::JobSpec& s, const spec::Source& source, const spec::Lines* lines) {
  const auto error = [&](const std::string& path, absl::string_view what) {
    return spec::FieldError(source, lines, path, what);
  };
  const int32_t tensor = s.parallel().tensor();
  if (s.resources().gpus() % tensor != 0) {
    return error("parallel.tensor", absl::StrCat("must divide resources.gpus (", s.resources().gpus(),
                                                 "): the ranks form groups of parallel.tensor; got ", tensor));
  }
  if (tensor > 1 && !s.evaluation().suites().empty()) {
    return error("evaluation.suites",
                 absl::StrCat("the evaluation suites run on one device; with parallel.tensor ", tensor,
                              " leave them out (data.validation's loss is computed across the ranks)"));
  }
  const int32_t replicas = s.resources().gpus() / tensor;
  if (s.training().batch_sequences() < replicas) {
    return error("training.batch_sequences",
                 absl::StrCat("must be >= resources.gpus / parallel.tensor (", replicas,
                              "): each data-parallel rank trains whole sequences of the global batch; got ",
                              s.training().batch_sequences()));
  }
  if (s.attention().mode() == v1::Attention::sparse) {
    if (s.memory().chunk_tokens() % s.memory().page_tokens() != 0) {
      return error("memory.chunk_tokens",
                   absl::StrCat("must be a multiple of memory.page_tokens (", s.memory().page_tokens(),
                                ") with attention.mode: sparse (chunks start on page boundaries), got ",
                                s.memory().chunk_tokens()));
    }
    const v1::SparseAttentionSpec& sp = s.attention().sparse();
    if (sp.sink_pages() + sp.local_pages() > sp.page_budget()) {
      return error("attention.sparse.page_budget",
                   absl::StrCat("must be >= sink_pages + local_pages (", sp.sink_pages() + sp.local_pages(), "), got ",
                                sp.page_budget()));
    }
  }
  OOMB_RETURN_IF_ERROR(CheckMethod(s, source, lines));
  if (s.method().type() == v1::Method::full && !s.method().lora().init_adapter().empty()) {
    return error("method.lora.init_adapter", "starts LoRA adapters: not with method.type full");
  }
  if (s.model().has_rope_scaling() && !s.model().rope_scaling().has_factor()) {
    return error("model.rope_scaling.factor", "is required when model.rope_scaling is set (the extension factor)");
  }
  return absl::OkStatus();
}

RopeScalingOverride RopeOf(const v1::RopeScaling& r) {
  RopeScalingOverride o;
  switch (r.type()) {
    case v1::RopeScaling::dynamic:
      o.type = RopeType::kDynamic;
      break;
    case v1::RopeScaling::yarn:
      o.type = RopeType::kYarn;
      break;
    case v1::RopeScaling::llama3:
      o.type = RopeType::kLlama3;
      break;
    default:
      o.type = RopeType::kLinear;
      break;
  }
  const auto opt = [](bool has, auto v) { return has ? std::optional<decltype(v)>(v) : std::nullopt; };
  o.factor = opt(r.has_factor(), r.factor());
  o.original_max_position_embeddings =
      opt(r.has_original_max_position_embeddings(), r.original_max_position_embeddings());
  o.low_freq_factor = opt(r.has_low_freq_factor(), r.low_freq_factor());
  o.high_freq_factor = opt(r.has_high_freq_factor(), r.high_freq_factor());
  o.beta_fast = opt(r.has_beta_fast(), r.beta_fast());
  o.beta_slow = opt(r.has_beta_slow(), r.beta_slow());
  return o;
}

void SetTraining(const v1::TrainingSpec& t, JobConfig::Training* out) {
  out->max_steps = t.max_steps();  // 0 when epochs is set (one of them)
  out->epochs = t.epochs();
  out->batch_sequences = t.batch_sequences();
  out->learning_rate = t.learning_rate();
  out->lr_schedule = t.lr_schedule() == v1::TrainingSpec::constant ? LrSchedule::kConstant
                     : t.lr_schedule() == v1::TrainingSpec::linear ? LrSchedule::kLinear
                                                                   : LrSchedule::kCosine;
  out->warmup_steps = t.warmup_steps();
  out->weight_decay = t.weight_decay();
  out->beta1 = t.adam().beta1();
  out->beta2 = t.adam().beta2();
  out->eps = t.adam().eps();
  out->max_grad_norm = t.max_grad_norm();
  out->seed = t.seed();
  out->eval_every_steps = t.eval_every_steps();
}

void SetMemoryAndAttention(const v1::JobSpec& s, JobConfig* out) {
  const v1::MemorySpec& m = s.memory();
  out->memory.chunk_tokens = m.chunk_tokens();
  out->memory.page_tokens = m.page_tokens();
  out->memory.kv_offload = m.kv_offload() == v1::MemorySpec::none   ? KvOffload::kNone
                           : m.kv_offload() == v1::MemorySpec::host ? KvOffload::kHost
                                                                    : KvOffload::kAuto;
  out->memory.kv_grad_dtype = m.kv_grad_dtype() == v1::KvGradDtype::bfloat16  ? KvGradDtype::kBFloat16
                              : m.kv_grad_dtype() == v1::KvGradDtype::float32 ? KvGradDtype::kFloat32
                                                                              : KvGradDtype::kAuto;
  out->memory.swap_attention = m.swap_attention();
  if (s.attention().mode() == v1::Attention::sparse) {
    const v1::SparseAttentionSpec& sp = s.attention().sparse();
    out->sparse =
        JobConfig::Sparse{.page_budget = sp.page_budget(),
                          .sink_pages = sp.sink_pages(),
                          .local_pages = sp.local_pages(),
                          .selection = sp.selection() == v1::SparseAttentionSpec::min_max ? PageSummaryKind::kMinMax
                                                                                          : PageSummaryKind::kMeanKey};
  }
  out->chunk_fraction = s.backward().chunk_fraction();
}

JobConfig ToConfig(const v1::JobSpec& s) {
  JobConfig c;
  c.display_name = s.display_name();
  c.labels = {s.labels().begin(), s.labels().end()};
  c.model.path = s.model().path();
  c.model.dtype = s.model().dtype() == v1::ModelSpec::float32 ? ModelDtype::kFloat32 : ModelDtype::kBFloat16;
  if (s.model().has_rope_scaling()) c.model.rope_scaling = RopeOf(s.model().rope_scaling());
  if (s.model().has_router_aux_loss_coef()) c.model.router_aux_loss_coef = s.model().router_aux_loss_coef();
  c.method.type = s.method().type() == v1::Method::full       ? TrainMethod::kFull
                  : s.method().type() == v1::Method::evaluate ? TrainMethod::kEvaluate
                                                              : TrainMethod::kLora;
  const v1::LoraSpec& l = s.method().lora();
  c.method.lora = {l.rank(),         l.alpha(),
                   l.dropout(),      {l.target_modules().begin(), l.target_modules().end()},
                   l.init_adapter(), {l.target_parameters().begin(), l.target_parameters().end()}};
  const v1::DataSpec& d = s.data();
  c.data = {d.train(),
            d.validation(),
            d.max_seq_len(),
            d.packing(),
            d.too_long() == v1::DataSpec::drop    ? TooLong::kDrop
            : d.too_long() == v1::DataSpec::error ? TooLong::kError
                                                  : TooLong::kTruncate,
            d.shuffle_seed(),
            d.validation_max_tokens()};
  SetTraining(s.training(), &c.training);
  SetMemoryAndAttention(s, &c);
  c.checkpoint = {s.checkpoint().every_steps(), s.checkpoint().keep_last(), s.checkpoint().dir()};
  const v1::ResourcesSpec& r = s.resources();
  c.resources = {r.device(), r.gpus(), r.priority(), r.max_retries(), r.max_runtime_seconds()};
  c.parallel.tensor = s.parallel().tensor();
  const v1::EvaluationSpec& e = s.evaluation();
  std::vector<EvalSuite> suites;
  for (const int suite : e.suites()) suites.push_back(*SuiteNamed(v1::Evaluation::Suite_Name(suite)));
  std::vector<RulerTask> tasks;
  for (const int task : e.ruler().tasks()) tasks.push_back(*RulerTaskNamed(v1::Evaluation::RulerTask_Name(task)));
  c.evaluation = {.suites = std::move(suites),
                  .every_steps = e.every_steps(),
                  .lengths = {e.lengths().begin(), e.lengths().end()},
                  .depths = e.depths(),
                  .trials = e.trials(),
                  .seed = static_cast<uint64_t>(e.seed()),
                  .haystack = e.haystack(),
                  .ruler_tasks = std::move(tasks),
                  .ruler_samples = e.ruler().samples(),
                  .ruler_threshold = e.ruler().threshold()};
  if (c.evaluation.lengths.empty()) c.evaluation.lengths = {c.data.max_seq_len};
  return c;
}

// The length in bytes of the control or bidirectional formatting character at `s[i]`; 0 when
// there is none.
size_t HiddenCharacterAt(absl::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return k < s.size() ? static_cast<unsigned char>(s[k]) : 0; };
  const unsigned char c = byte(i);
  if (c < 0x20 || c == 0x7f) return 1;
  if (c == 0xc2 && byte(i + 1) >= 0x80 && byte(i + 1) <= 0x9f) return 2;  // C1: U+0080 to U+009F
  if (c == 0xd8 && byte(i + 1) == 0x9c) return 2;                         // U+061C
  if (c == 0xe2 && byte(i + 1) == 0x80) {
    const unsigned char d = byte(i + 2);
    if (d == 0x8e || d == 0x8f || (d >= 0xaa && d <= 0xae)) return 3;  // U+200E, U+200F, U+202A-U+202E
  }
  if (c == 0xe2 && byte(i + 1) == 0x81 && byte(i + 2) >= 0xa6 && byte(i + 2) <= 0xa9) return 3;  // U+2066-U+2069
  return 0;
}

}  // namespace

absl::Status CheckDisplayName(const std::string& display_name, const spec::Source& source, const spec::Lines* lines) {
  for (size_t i = 0; i < display_name.size(); ++i) {
    const size_t n = HiddenCharacterAt(display_name, i);
    if (n == 0) continue;
    std::string code;
    for (size_t k = 0; k < n; ++k)
      absl::StrAppend(&code, k == 0 ? "" : " ",
                      absl::Hex(static_cast<unsigned char>(display_name[i + k]), absl::kZeroPad2));
    return spec::FieldError(
        source, lines, "display_name",
        absl::StrCat("must not hold control or bidirectional formatting characters (bytes ", code, " at byte ", i + 1,
                     "), which would change how the name and what "
                     "follows it are shown"));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobConfig> ResolveJobSpec(v1::JobSpec* spec, const spec::Source& source, const spec::Lines* lines) {
  spec::FillDefaults(spec);
  absl::Status s = spec::CheckRules(*spec, /*check_required=*/true, source, lines);
  std::vector<std::string> choices;
  if (s.ok()) choices = ResolveAutoPages(spec);
  if (s.ok()) s = CheckRelations(*spec, source, lines);
  if (s.ok()) s = CheckEvaluation(*spec, source, lines);
  if (s.ok()) s = CheckDisplayName(spec->display_name(), source, lines);
  if (!s.ok()) return WithReason(s, Reason::kBadSpec);
  JobConfig config = ToConfig(*spec);
  config.choices = std::move(choices);
  return config;
}

absl::StatusOr<JobConfig> ResolveJobSpec(const v1::JobSpec& spec) {
  v1::JobSpec copy = spec;
  return ResolveJobSpec(&copy);
}

absl::StatusOr<RopeScalingOverride> ParseRopeScaling(absl::string_view yaml, const std::string& source) {
  const spec::Source where{source, ""};
  v1::RopeScaling r;
  OOMB_RETURN_IF_ERROR(spec::ParseYaml(yaml, where, &r));
  OOMB_RETURN_IF_ERROR(spec::CheckRules(r, /*check_required=*/true, where));
  if (!r.has_factor()) return spec::FieldError(where, nullptr, "factor", "is required (the extension factor)");
  return RopeOf(r);
}

std::vector<std::string> IgnoredSettingWarnings(const v1::JobSpec& sent) {
  std::vector<std::string> out;
  if (sent.method().type() == v1::Method::evaluate) {
    const v1::LoraSpec& lora = sent.method().lora();
    const std::pair<bool, const char*> ignored[] = {
        {lora.has_rank(), "method.lora.rank"},
        {lora.has_alpha(), "method.lora.alpha"},
        {lora.has_dropout(), "method.lora.dropout"},
        {lora.target_modules_size() > 0, "method.lora.target_modules"},
        {lora.target_parameters_size() > 0, "method.lora.target_parameters"},
        {sent.has_training(), "training"},
        {sent.has_checkpoint(), "checkpoint"},
    };
    for (const auto& [set, field] : ignored) {
      if (set) {
        out.push_back(absl::StrCat(field,
                                   ": ignored by method.type evaluate (it trains nothing and writes no checkpoint; "
                                   "the adapter's adapter_config.json gives its rank, alpha and targets)"));
      }
    }
  } else if (sent.training().eval_every_steps() > 0 && sent.data().validation().empty()) {
    out.push_back("training.eval_every_steps: no data.validation to evaluate, so nothing is evaluated");
  }
  return out;
}

}  // namespace oomb::server
