// The job executor: model, data, pages, the chunk-recurrent trainer, AdamW, schedules,
// checkpoints and progress, for one job on one device. Contract: worker/job/executor.h.
#include "worker/job/executor.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#if defined(OOMB_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "worker/common/status.h"
#include "worker/data/dataset.h"
#include "worker/job/build_info.h"
#include "worker/kv/kv_pools.h"
#include "worker/metrics/flops.h"
#include "worker/model/chat_template.h"
#include "worker/model/tokenizer.h"
#include "worker/model/transformer.h"
#include "worker/plan/memory_planner.h"
#include "worker/train/checkpoint.h"
#include "worker/train/chunk_trainer.h"
#include "worker/train/data_parallel.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/torch_status.h"

namespace oomb {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

absl::StatusOr<at::Device> ResolveDevice(const std::string& requested) {
  const std::string d = requested.empty() ? "auto" : requested;
  if (d == "cpu") return at::Device(at::kCPU);
  const bool cuda = torch::cuda::is_available();
  if (d == "auto") return cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  if (d.rfind("cuda", 0) == 0) {
    if (!cuda) return absl::FailedPreconditionError(absl::StrCat("resources.device: '", d, "' but no CUDA device"));
    const int index = d == "cuda" ? 0 : std::stoi(d.substr(5));
    if (index >= static_cast<int>(torch::cuda::device_count())) {
      return absl::FailedPreconditionError(
          absl::StrCat("resources.device: '", d, "' but only ", torch::cuda::device_count(), " CUDA devices"));
    }
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  return absl::InvalidArgumentError(absl::StrCat("resources.device: '", d, "' is not auto, cpu, cuda or cuda:N"));
}

// The devices of the run's ranks: RunOptions::devices, or derived from the spec (see
// executor.h). All CPU or all distinct CUDA devices.
absl::StatusOr<std::vector<at::Device>> ResolveDevices(const JobConfig& spec, const std::vector<std::string>& given) {
  const auto k = static_cast<size_t>(spec.resources.gpus);
  std::vector<at::Device> devices;
  if (!given.empty()) {
    if (given.size() != k) {
      return absl::InvalidArgumentError(
          absl::StrCat("resources.gpus: ", k, " but the run was given ", given.size(), " devices"));
    }
    for (const std::string& d : given) {
      OOMB_ASSIGN_OR_RETURN(at::Device device, ResolveDevice(d));
      devices.push_back(device);
    }
  } else {
    OOMB_ASSIGN_OR_RETURN(at::Device first, ResolveDevice(spec.resources.device));
    for (size_t r = 0; r < k; ++r) {
      devices.push_back(first.is_cpu() ? first
                                       : at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(first.index() + r)));
    }
    if (first.is_cuda() && first.index() + static_cast<int64_t>(k) > torch::cuda::device_count()) {
      return absl::FailedPreconditionError(absl::StrCat("resources.gpus: ", k, " from ", first.str(), " but only ",
                                                        torch::cuda::device_count(), " CUDA devices"));
    }
  }
  for (size_t r = 1; r < devices.size(); ++r) {
    if (devices[r].type() != devices[0].type()) {
      return absl::InvalidArgumentError("resources.gpus: the ranks' devices must all be CUDA or all the CPU");
    }
    for (size_t q = 0; devices[r].is_cuda() && q < r; ++q) {
      if (devices[q] == devices[r]) {
        return absl::InvalidArgumentError(absl::StrCat("resources.gpus: device ", devices[r].str(), " given twice"));
      }
    }
  }
  return devices;
}

// One rank of a run: which, of how many, and what the ranks of a data-parallel run share.
struct Rank {
  int index = 0;
  int world = 1;
  const Rendezvous* rendezvous = nullptr;  // world > 1
  std::atomic<int>* stop = nullptr;        // world > 1: rank 0's StopRequest, read by the others
};

kernels::PageSelectOptions PageSelection(const JobConfig& spec) {
  const JobConfig::Sparse& sp = *spec.sparse;
  kernels::PageSelectOptions o;
  o.page_tokens = spec.memory.page_tokens;
  o.page_budget = sp.page_budget;
  o.sink_pages = sp.sink_pages;
  o.local_pages = sp.local_pages;
  o.summary = sp.selection == PageSummaryKind::kMinMax ? kernels::PageSummary::kMinMax : kernels::PageSummary::kMeanKey;
  return o;
}

// Peak device memory of the last step: the CUDA caching allocator's peak on a GPU; on the CPU
// the trainer's tracked allocations plus the KV pages in use.
int64_t PeakDeviceBytes(const at::Device& device, const TrainerMemory& m) {
#if defined(OOMB_HAVE_CUDA)
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  }
#endif
  return m.activation_peak_bytes + m.kv_peak_bytes + m.kv_grad_peak_bytes;
}

void ResetPeak(const at::Device& device) {
#if defined(OOMB_HAVE_CUDA)
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
}

// The device's datasheet BF16 peak for MFU; 0 on the CPU and unlisted GPUs.
double PeakFlops(const at::Device& device) {
#if defined(OOMB_HAVE_CUDA)
  if (device.is_cuda()) return PeakDenseBf16Flops(at::cuda::getDeviceProperties(device.index())->name);
#endif
  return 0;
}

// Failpoints for the reliability tests (RELIABILITY.md): only when the process runs with
// OOMB_FAILPOINTS=1, a job labelled `failpoint: oom-at-step-N` gets a real
// c10::OutOfMemoryError at the start of step N, as an exhausted allocator would throw it.
int64_t OomFailpointStep(const JobConfig& spec) {
  const char* enabled = std::getenv("OOMB_FAILPOINTS");
  if (enabled == nullptr || std::string(enabled) != "1") return 0;
  auto it = spec.labels.find("failpoint");
  int64_t step = 0;
  if (it == spec.labels.end() || !absl::SimpleAtoi(absl::StripPrefix(it->second, "oom-at-step-"), &step)) return 0;
  return step;
}

// The datasets of a job, read and checked, with the model directory and the tokenizer that
// read them (null when every sample was pre-tokenized).
struct JobData {
  std::optional<Dir> model_dir;
  std::unique_ptr<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat;
  std::vector<Document> train;
  DatasetStats stats;
  std::vector<Document> validation;
};

// The tokenizer is loaded lazily (ModelTokenizer): pre-tokenized data needs no tokenizer.json.
absl::StatusOr<JobData> ReadJobData(const JobConfig& spec, const FileAccess& files) {
  JobData data;
  absl::StatusOr<Dir> model_dir = files.OpenDir(spec.model.path);
  if (!model_dir.ok()) return Annotate(model_dir.status(), "model.path");
  data.model_dir = *model_dir;
  ModelTokenizer model_tokenizer(*model_dir, "model.path");
  const TokenizerLoader loader = model_tokenizer.Loader();
  DatasetOptions options;
  options.max_seq_len = spec.data.max_seq_len;
  options.too_long = spec.data.too_long;
  absl::StatusOr<int64_t> vocab = ModelVocabSize(*model_dir);
  if (!vocab.ok()) return Annotate(vocab.status(), "model.path");
  options.vocab_size = *vocab;
  absl::StatusOr<File> train = files.OpenFile(spec.data.train);
  if (!train.ok()) return Annotate(train.status(), "data.train");
  OOMB_ASSIGN_OR_RETURN(data.train, ReadJsonlDataset(*train, loader, options, &data.stats));
  if (data.stats.label_tokens == 0) {
    return WithReason(absl::InvalidArgumentError(absl::StrCat(
                          "data.train: ", spec.data.train,
                          ": no token carries a label (every label is -100, or no sample has an assistant turn "
                          "or more than one token): there is nothing to train on")),
                      Reason::kBadData);
  }
  if (!spec.data.validation.empty()) {
    options.field = "data.validation";
    absl::StatusOr<File> validation = files.OpenFile(spec.data.validation);
    if (!validation.ok()) return Annotate(validation.status(), "data.validation");
    OOMB_ASSIGN_OR_RETURN(data.validation, ReadJsonlDataset(*validation, loader, options, nullptr));
  }
  data.tokenizer = model_tokenizer.TakeTokenizer();
  data.chat = model_tokenizer.TakeChat();
  return data;
}

class Run {
 public:
  Run(const JobConfig& spec, const RunOptions& options, at::Device device, Rank rank)
      : spec_(spec), options_(options), device_(device), rank_(rank) {}

  absl::StatusOr<RunResult> Execute() {
    if (rank_.world > 1) {
      OOMB_ASSIGN_OR_RETURN(group_, DataParallelGroup::Join(*rank_.rendezvous, rank_.index, rank_.world, device_));
    }
    OOMB_RETURN_IF_ERROR(Agree(Guarded([this] { return Setup(); })));
    return Train();
  }

 private:
  bool lead() const { return rank_.index == 0; }

  // Data parallel: every rank learns, at the same point of the run, whether any rank failed or
  // was asked to stop (one small collective). Returns this rank's own error, or ABORTED
  // with reason PEER_FAILED when only another rank failed. `extra` values are summed over the ranks on
  // the way (in place). One device: returns `mine`.
  absl::Status Agree(const absl::Status& mine, std::vector<double>* extra = nullptr) {
    if (group_ == nullptr) return mine;
    std::vector<double> values = {mine.ok() ? 0.0 : 1.0, stop_ == StopRequest::kPause ? 1.0 : 0.0,
                                  stop_ == StopRequest::kCancel ? 1.0 : 0.0};
    if (extra != nullptr) values.insert(values.end(), extra->begin(), extra->end());
    OOMB_ASSIGN_OR_RETURN(std::vector<double> sums, group_->SumAcrossRanks(values));
    if (sums[0] > 0) {
      return mine.ok()
                 ? WithReason(absl::AbortedError("another rank of the data-parallel run failed"), Reason::kPeerFailed)
                 : mine;
    }
    if (sums[2] > 0) {
      stop_ = StopRequest::kCancel;
    } else if (sums[1] > 0) {
      stop_ = StopRequest::kPause;
    }
    if (extra != nullptr) std::copy(sums.begin() + 3, sums.end(), extra->begin());
    return absl::OkStatus();
  }

  absl::Status Setup() {
    dtype_ = spec_.model.dtype == ModelDtype::kFloat32 ? at::kFloat : at::kBFloat16;
    oom_failpoint_step_ = OomFailpointStep(spec_);
    OOMB_ASSIGN_OR_RETURN(JobData data, ReadJobData(spec_, *options_.files));
    model_dir_ = data.model_dir;

    OOMB_RETURN_IF_ERROR(ReadBaseFiles());
    tokenizer_ = std::move(data.tokenizer);
    chat_ = std::move(data.chat);
    docs_ = std::move(data.train);
    stats_ = data.stats;
    if (!spec_.data.validation.empty()) {
      validation_ = PackDocuments(data.validation, spec_.data.max_seq_len, spec_.data.packing, -1);
    }
    const auto first_epoch = PackDocuments(docs_, spec_.data.max_seq_len, spec_.data.packing, spec_.data.shuffle_seed);
    sequences_per_epoch_ = static_cast<int64_t>(first_epoch.size());
    total_steps_ = spec_.training.max_steps > 0
                       ? spec_.training.max_steps
                       : spec_.training.epochs * ((sequences_per_epoch_ + spec_.training.batch_sequences - 1) /
                                                  spec_.training.batch_sequences);

    absl::StatusOr<std::unique_ptr<Transformer>> model =
        Transformer::Load(*model_dir_, dtype_, device_, spec_.model.rope_scaling);
    if (!model.ok()) return ModelError(model.status());
    model_ = *std::move(model);
    if (spec_.method.type == TrainMethod::kLora) {
      LoraOptions lora;
      lora.rank = spec_.method.lora.rank;
      lora.alpha = spec_.method.lora.alpha;
      lora.dropout = spec_.method.lora.dropout;
      lora.target_modules = spec_.method.lora.target_modules;
      OOMB_RETURN_IF_ERROR(model_->AddLora(lora, static_cast<uint64_t>(spec_.training.seed)));
    } else {
      model_->EnableFullFineTuning();
    }
    for (auto& [name, p] : model_->TrainableParameters()) params_.push_back(p);
    torch::optim::AdamWOptions adam(spec_.training.learning_rate);
    adam.betas({spec_.training.beta1, spec_.training.beta2});
    adam.eps(spec_.training.eps);
    adam.weight_decay(spec_.training.weight_decay);
    optimizer_ = std::make_unique<torch::optim::AdamW>(params_, adam);

    // KV and KV-gradient pages for the longest sequence (plus one straddling page a layer),
    // placed by the memory planner: what fits on the device, the rest in the host tier.
    int64_t longest = 1;
    for (const auto& s : first_epoch) longest = std::max(longest, s.size());
    for (const auto& s : validation_) longest = std::max(longest, s.size());
    const ModelConfig& c = model_->config();
    JobConfig planned = spec_;
    planned.data.max_seq_len = longest;
    OOMB_ASSIGN_OR_RETURN(const MemoryPlan plan,
                          PlanMemory(c, planned, ThisMachine(device_.is_cuda() ? device_.str() : "cpu")));
    // Host slabs are pinned by the pools' own threads from now on, while the first chunks run on
    // the device pages.
    OOMB_ASSIGN_OR_RETURN(kv_, MakeKvPools({c.num_kv_heads, spec_.memory.page_tokens, c.head_dim}, dtype_,
                                           GradPageDtype(spec_.memory.kv_grad_dtype == KvGradDtype::kBFloat16, dtype_),
                                           device_, PoolSizes(plan)));
    if (options_.kv_stats != nullptr) {
      const std::string slot = options_.devices.empty() ? device_.str() : options_.devices[rank_.index];
      if (kv_.copies != nullptr) {
        kv_.copies->set_observer(
            [registry = options_.kv_stats, slot](TransferDirection d, PageKind kind, int64_t bytes, double seconds) {
              registry->RecordTransfer(slot, d, kind, bytes, seconds);
            });
      }
      for (PagePool* pool : kv_.all()) {
        const PoolStats ps = pool->stats();
        pool->AttachCounters(options_.kv_stats->AddPool(slot, ps.tier, ps.kind, ps.capacity_pages, ps.bytes_per_page));
      }
    }
    peak_flops_ = PeakFlops(device_);
    ChunkTrainerOptions trainer_options;
    trainer_options.chunk_tokens = spec_.memory.chunk_tokens;
    trainer_options.chunk_fraction = spec_.chunk_fraction;
    if (spec_.sparse.has_value()) trainer_options.sparse = PageSelection(spec_);
    trainer_options.should_stop = [this] { return PollStop(); };
    trainer_ = std::make_unique<ChunkTrainer>(model_.get(), kv_.pools(), trainer_options);

    if (options_.resume) OOMB_RETURN_IF_ERROR(Resume());
    return absl::OkStatus();
  }

  // A failure to read the model's files: the model's fault unless the cause says otherwise.
  static absl::Status ModelError(const absl::Status& s) {
    const absl::Status named = Annotate(s, "model.path");
    return ReasonOf(s).has_value() ? named : WithReason(named, Reason::kBadModel);
  }

  // The base model's files a checkpoint carries (the tokenizer's), read now: a file that cannot
  // be read fails the job before any training.
  absl::Status ReadBaseFiles() {
    for (const char* name :
         {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"}) {
      if (!model_dir_->Contains(name)) continue;
      absl::StatusOr<std::string> contents = model_dir_->ReadFile(name, kMaxBaseFileBytes);
      if (!contents.ok()) return Annotate(contents.status(), "model.path");
      base_files_[name] = *std::move(contents);
    }
    return absl::OkStatus();
  }
  static constexpr int64_t kMaxBaseFileBytes = int64_t{256} << 20;

  absl::Status Resume() {
    const Dir& root = *options_.checkpoint_dir;
    for (const std::string& name : ListCheckpointDirs(root)) {
      absl::StatusOr<Dir> dir = root.OpenDir(name);
      auto state = dir.ok() ? RestoreCheckpoint(*dir, *model_, *optimizer_) : dir.status();
      if (state.ok()) {
        state_ = *state;
        Warn(absl::StrCat("resumed from ", root.PathOf(name), " at step ", state_.step));
        return absl::OkStatus();
      }
      Warn(absl::StrCat("skipping checkpoint ", root.PathOf(name), ": ", state.status().message()));
    }
    if (state_.step == 0) Warn("no valid checkpoint to resume from: starting at step 0");
    return absl::OkStatus();
  }

  // Rank 0 asks poll_stop and passes the answer on to the other ranks (Rank::stop); the ranks
  // act on it together (Agree).
  bool PollStop() {
    if (stop_ == StopRequest::kNone) {
      if (lead() && options_.poll_stop) stop_ = options_.poll_stop();
      if (rank_.stop != nullptr) {
        if (lead() && stop_ != StopRequest::kNone) rank_.stop->store(static_cast<int>(stop_));
        if (!lead()) stop_ = static_cast<StopRequest>(rank_.stop->load());
      }
    }
    return stop_ != StopRequest::kNone;
  }

  void Warn(const std::string& msg) {
    if (lead() && options_.on_warning) options_.on_warning(msg);
  }

  const std::vector<TokenSequence>& EpochSequences(int64_t epoch) {
    if (epoch != packed_epoch_) {
      const int64_t seed = spec_.data.shuffle_seed < 0 ? -1 : spec_.data.shuffle_seed + epoch;
      epoch_sequences_ = PackDocuments(docs_, spec_.data.max_seq_len, spec_.data.packing, seed);
      packed_epoch_ = epoch;
    }
    return epoch_sequences_;
  }

  absl::StatusOr<CheckpointInfo> Checkpoint(bool final) {
    const Dir& root = *options_.checkpoint_dir;
    const std::string name = final ? std::string("final") : absl::StrCat("checkpoint-", state_.step);
    CheckpointWriteOptions w;
    w.base_model_path = spec_.model.path;
    w.base_files = base_files_;
    if (!model_->has_lora()) {
      OOMB_ASSIGN_OR_RETURN(w.config_json, model_dir_->ReadFile("config.json"));
    }
    const auto started = Clock::now();
    OOMB_ASSIGN_OR_RETURN(int64_t bytes, WriteCheckpoint(root, name, *model_, *optimizer_, state_, w));
    PruneCheckpoints(root, spec_.checkpoint.keep_last);
    const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
    CheckpointInfo info{state_.step, root.PathOf(name), bytes, final, seconds};
    if (options_.on_checkpoint) options_.on_checkpoint(info);
    return info;
  }

  // The mean loss over the validation sequences; data parallel: each rank evaluates its share
  // and the sums are combined (Agree, with this rank's status so far as `mine`). 0 (no eval
  // loss) when a stop was asked for during the evaluation: the step is reported without it,
  // and the run stops at the step's end.
  absl::StatusOr<double> Evaluate(const absl::Status& mine) {
    std::vector<double> sums = {0, 0};
    absl::Status local = mine;
    if (local.ok()) {
      local = Guarded([&]() -> absl::Status {
        for (size_t i = 0; i < validation_.size(); ++i) {
          if (group_ != nullptr && !group_->Owns(static_cast<int64_t>(i))) continue;
          OOMB_ASSIGN_OR_RETURN(SequenceLoss l, trainer_->EvalSequence(validation_[i]));
          sums[0] += l.loss_sum;
          sums[1] += static_cast<double>(l.label_tokens);
        }
        return absl::OkStatus();
      });
    }
    if (absl::IsCancelled(local)) local = absl::OkStatus();  // stop_ is set: Agree passes it on
    OOMB_RETURN_IF_ERROR(Agree(local, &sums));
    if (stop_ != StopRequest::kNone) return 0.0;
    return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  }

  // The global batch of the step after `state_`: training.batch_sequences sequences, and the
  // state after them. Held by value: a batch that crosses into the next epoch re-packs the
  // epoch's sequences, which would leave pointers into the previous epoch dangling.
  std::vector<TokenSequence> NextBatch(TrainerState* next) {
    std::vector<TokenSequence> batch;
    *next = state_;
    for (int64_t i = 0; i < spec_.training.batch_sequences; ++i) {
      const auto& seqs = EpochSequences(next->epoch);
      batch.push_back(seqs[next->cursor]);
      if (++next->cursor == static_cast<int64_t>(seqs.size())) {
        next->cursor = 0;
        ++next->epoch;
      }
    }
    return batch;
  }

  // This rank's sequences of the batch: forward and backward, gradients accumulated (not yet
  // summed over ranks). CANCELLED when asked to stop mid-sequence.
  absl::Status TrainLocal(const std::vector<TokenSequence>& batch, int64_t label_tokens, double* loss_sum,
                          StepProgress* p, TrainerMemory* peak, SparseStats* sparse) {
    if (state_.step + 1 == oom_failpoint_step_) {  // this step
      TORCH_CHECK_WITH(OutOfMemoryError, false, "injected by the failpoint label 'failpoint: oom-at-step-",
                       oom_failpoint_step_, "' (OOMB_FAILPOINTS=1)");
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      if (group_ != nullptr && !group_->Owns(static_cast<int64_t>(i))) continue;
      const uint64_t dropout_seed =
          static_cast<uint64_t>(spec_.training.seed) * 1000003u + static_cast<uint64_t>(state_.step) * 131u + i;
      OOMB_ASSIGN_OR_RETURN(
          SequenceLoss l, trainer_->TrainSequence(batch[i], label_tokens > 0 ? 1.0 / label_tokens : 0.0, dropout_seed));
      *loss_sum += l.loss_sum;
      const ChunkTimes& times = trainer_->chunk_times();
      p->forward_chunk_seconds.insert(p->forward_chunk_seconds.end(), times.forward.begin(), times.forward.end());
      p->backward_chunk_seconds.insert(p->backward_chunk_seconds.end(), times.backward.begin(), times.backward.end());
      const TrainerMemory& m = trainer_->memory();
      peak->activation_peak_bytes = std::max(peak->activation_peak_bytes, m.activation_peak_bytes);
      peak->kv_peak_bytes = std::max(peak->kv_peak_bytes, m.kv_peak_bytes);
      peak->kv_grad_peak_bytes = std::max(peak->kv_grad_peak_bytes, m.kv_grad_peak_bytes);
      peak->host_kv_peak_bytes = std::max(peak->host_kv_peak_bytes, m.host_kv_peak_bytes);
      if (spec_.sparse.has_value()) {
        const SparseStats& st = trainer_->sparse_stats();
        sparse->selected_pages += st.selected_pages;
        sparse->past_pages += st.past_pages;
        sparse->attended_pairs += st.attended_pairs;
      }
    }
    return absl::OkStatus();
  }

  // One step's collectives and the points where the ranks agree (data parallel): after the
  // local sequences (losses summed, stop or failure seen by all), after the optimizer step and
  // eval, and after rank 0's reporting and checkpoint. One device: the same code, no
  // collectives.
  absl::StatusOr<RunResult> Train() {
    RunResult result;
    UniqueFd metrics;
    if (lead()) {
      absl::StatusOr<UniqueFd> fd = options_.checkpoint_dir->OpenAppend("metrics.jsonl");
      if (!fd.ok()) return fd.status();
      metrics = *std::move(fd);
    }
    const auto start = Clock::now();
    const int64_t first_step = state_.step;
    const ModelConfig& c = model_->config();
    while (state_.step < total_steps_) {
      const auto step_start = Clock::now();
      const int64_t this_step = state_.step + 1;
      ResetPeak(device_);
      TrainerState next;
      const std::vector<TokenSequence> batch = NextBatch(&next);
      int64_t label_tokens = 0, tokens = 0;
      StepProgress p;
      for (const TokenSequence& s : batch) {
        label_tokens += s.label_tokens();
        tokens += s.size();
        p.model_flops += SequenceTrainingFlops(c.ParameterCount(), c.q_dim(), c.num_layers, s.size());
      }
      const double lr = LearningRate(spec_.training, state_.step, total_steps_);
      for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);

      // Summed over ranks: the loss, and sparse attention's selected pages, past pages and
      // attended query-key pairs.
      std::vector<double> loss_sum = {0, 0, 0, 0};
      TrainerMemory peak;
      SparseStats sparse;
      absl::Status local = Guarded([&] { return TrainLocal(batch, label_tokens, &loss_sum[0], &p, &peak, &sparse); });
      if (absl::IsCancelled(local)) local = absl::OkStatus();  // stop_ is set: Agree passes it on
      loss_sum[1] = static_cast<double>(sparse.selected_pages);
      loss_sum[2] = static_cast<double>(sparse.past_pages);
      loss_sum[3] = sparse.attended_pairs;
      OOMB_RETURN_IF_ERROR(Agree(local, &loss_sum));
      if (spec_.sparse.has_value()) {
        p.attention_density = loss_sum[2] > 0 ? loss_sum[1] / loss_sum[2] : 1.0;
        p.model_flops = 6.0 * static_cast<double>(c.ParameterCount()) * static_cast<double>(tokens) +
                        12.0 * static_cast<double>(c.head_dim) * loss_sum[3];
      }
      if (stop_ != StopRequest::kNone) return Stopped();
      if (group_ != nullptr) OOMB_RETURN_IF_ERROR(group_->AllReduceGradients(params_));

      const double loss = label_tokens > 0 ? loss_sum[0] / label_tokens : 0.0;
      if (!std::isfinite(loss)) {
        return WithReason(absl::InternalError(absl::StrCat("loss is ", loss, " at step ", state_.step + 1)),
                          Reason::kNanLoss);
      }
      absl::Status stepped = Guarded([&] {
        if (spec_.training.max_grad_norm > 0) {
          torch::nn::utils::clip_grad_norm_(optimizer_->param_groups()[0].params(), spec_.training.max_grad_norm);
        }
        optimizer_->step();
        optimizer_->zero_grad(/*set_to_none=*/true);
        return absl::OkStatus();
      });
      if (stepped.ok()) {
        state_.step += 1;
        state_.epoch = next.epoch;
        state_.cursor = next.cursor;
        state_.tokens += tokens;
        state_.loss = loss;
      }
      // Decided on the step's number, which every rank knows even if its optimizer step failed.
      if (!validation_.empty() && spec_.training.eval_every_steps > 0 &&
          this_step % spec_.training.eval_every_steps == 0) {
        OOMB_ASSIGN_OR_RETURN(p.eval_loss, Evaluate(stepped));
      }

      const bool last = state_.step == total_steps_;
      absl::Status reported = stepped;
      if (reported.ok() && lead()) {
        p.step = state_.step;
        p.total_steps = total_steps_;
        p.tokens = state_.tokens;
        p.step_tokens = tokens;
        p.loss = loss;
        p.learning_rate = lr;
        p.step_seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
        p.tokens_per_second = p.step_seconds > 0 ? tokens / p.step_seconds : 0;
        if (peak_flops_ > 0 && p.step_seconds > 0) p.mfu = p.model_flops / p.step_seconds / (peak_flops_ * rank_.world);
        const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
        p.eta_seconds = elapsed / static_cast<double>(state_.step - first_step) * (total_steps_ - state_.step);
        p.peak_device_bytes = PeakDeviceBytes(device_, peak);
        p.host_kv_bytes = peak.host_kv_peak_bytes;
        if (kv_.copies != nullptr) {
          p.pcie_h2d_bytes = kv_.copies->bytes_to_device();
          p.pcie_d2h_bytes = kv_.copies->bytes_to_host();
        }
        nlohmann::json line = {{"step", p.step},
                               {"loss", p.loss},
                               {"lr", p.learning_rate},
                               {"tokens", p.tokens},
                               {"seconds", p.step_seconds},
                               {"tokens_per_second", p.tokens_per_second},
                               {"peak_device_bytes", p.peak_device_bytes},
                               {"peak_host_bytes", p.host_kv_bytes},
                               {"pcie_h2d_bytes", p.pcie_h2d_bytes},
                               {"pcie_d2h_bytes", p.pcie_d2h_bytes}};
        if (p.eval_loss > 0) line["eval_loss"] = p.eval_loss;
        if (p.attention_density > 0) line["attention_density"] = p.attention_density;
        const std::string text = line.dump() + "\n";
        if (::write(metrics.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
          reported = ErrnoStatus(errno, "write", options_.checkpoint_dir->PathOf("metrics.jsonl"));
        }
        if (options_.on_step) options_.on_step(p);
        if (reported.ok() && !last && spec_.checkpoint.every_steps > 0 &&
            state_.step % spec_.checkpoint.every_steps == 0) {
          absl::StatusOr<CheckpointInfo> saved = Checkpoint(false);
          reported = saved.status();
          if (saved.ok()) result.final_checkpoint = *saved;
        }
      }
      if (!last) PollStop();
      OOMB_RETURN_IF_ERROR(Agree(reported));
      if (!last && stop_ != StopRequest::kNone) return Stopped();
    }
    if (lead()) {
      OOMB_ASSIGN_OR_RETURN(result.final_checkpoint, Checkpoint(true));
    }
    result.outcome = RunOutcome::kSucceeded;
    return result;
  }

  // Cancel: nothing more is written. Pause: a checkpoint of the last completed step (rank 0).
  absl::StatusOr<RunResult> Stopped() {
    RunResult r;
    optimizer_->zero_grad(/*set_to_none=*/true);
    if (stop_ == StopRequest::kPause) {
      r.outcome = RunOutcome::kPaused;
      if (!lead()) return r;
      OOMB_ASSIGN_OR_RETURN(r.final_checkpoint, Checkpoint(false));
    } else {
      r.outcome = RunOutcome::kCancelled;
    }
    return r;
  }

  const JobConfig& spec_;
  const RunOptions& options_;
  const at::Device device_;
  const Rank rank_;
  std::unique_ptr<DataParallelGroup> group_;  // world > 1
  std::vector<at::Tensor> params_;            // the trainable parameters, in the optimizer's order
  at::ScalarType dtype_ = at::kBFloat16;
  std::optional<Dir> model_dir_;
  std::map<std::string, std::string> base_files_;  // copied into every checkpoint
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_;
  std::vector<Document> docs_;
  DatasetStats stats_;
  std::vector<TokenSequence> validation_;
  int64_t oom_failpoint_step_ = 0;  // > 0: a failpoint throws an out-of-memory error at this step
  std::vector<TokenSequence> epoch_sequences_;
  int64_t packed_epoch_ = -1;
  int64_t sequences_per_epoch_ = 0;
  int64_t total_steps_ = 0;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  OwnedKvPools kv_;  // the page pools, placed by the memory planner
  std::unique_ptr<ChunkTrainer> trainer_;
  double peak_flops_ = 0;  // the device's, for MFU; 0: unknown
  TrainerState state_;
  StopRequest stop_ = StopRequest::kNone;
};

// The ranks of a run (one thread each beyond the first), and their outcome.
absl::StatusOr<RunResult> RunRanks(const JobConfig& spec, const RunOptions& options) {
  absl::StatusOr<std::vector<at::Device>> devices;
  OOMB_RETURN_IF_ERROR(Guarded([&] {
    devices = ResolveDevices(spec, options.devices);
    return devices.status();
  }));
  const int world = static_cast<int>(devices->size());
  if (world == 1) {
    absl::StatusOr<RunResult> result;
    OOMB_RETURN_IF_ERROR(Guarded([&] {
      result = Run(spec, options, devices->front(), Rank{}).Execute();
      return absl::OkStatus();
    }));
    return result;
  }
  // Data parallel: one thread per rank; the run's outcome is rank 0's, unless a rank failed.
  const Rendezvous rendezvous = Rendezvous::InProcess();
  std::atomic<int> stop{static_cast<int>(StopRequest::kNone)};
  std::vector<absl::StatusOr<RunResult>> results(world, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      const Rank rank{.index = r, .world = world, .rendezvous = &rendezvous, .stop = &stop};
      absl::Status thrown = Guarded([&] {
        results[r] = Run(spec, options, (*devices)[r], rank).Execute();
        return absl::OkStatus();
      });
      if (!thrown.ok()) results[r] = thrown;
    });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& result : results) {
    if (!result.ok() && ReasonOf(result.status()) != Reason::kPeerFailed) return result.status();
  }
  return results[0];
}

}  // namespace

void InitExecutorProcess() { DisableFlightRecorder(); }

absl::StatusOr<RunResult> RunJob(const JobConfig& spec, const RunOptions& options) {
  if (options.files == nullptr || !options.checkpoint_dir.has_value()) {
    return absl::InvalidArgumentError("RunJob: RunOptions::files and checkpoint_dir are required");
  }
  OOMB_RETURN_IF_ERROR(RemovePartialCheckpoints(*options.checkpoint_dir));
  absl::StatusOr<RunResult> result = RunRanks(spec, options);
  if (!result.ok()) (void)RemovePartialCheckpoints(*options.checkpoint_dir);
  return result;
}

absl::StatusOr<DataSummary> ValidateJobData(const JobConfig& spec, const FileAccess& files) {
  DataSummary summary;
  OOMB_RETURN_IF_ERROR(Guarded(
      [&]() -> absl::Status {
        OOMB_ASSIGN_OR_RETURN(JobData data, ReadJobData(spec, files));
        summary.train = data.stats;
        summary.sequences = static_cast<int64_t>(
            PackDocuments(data.train, spec.data.max_seq_len, spec.data.packing, spec.data.shuffle_seed).size());
        return absl::OkStatus();
      },
      "reading the datasets"));
  return summary;
}

}  // namespace oomb
