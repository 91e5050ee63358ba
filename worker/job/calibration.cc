#include "worker/job/calibration.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#if defined(OOMB_HAVE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/torch/chunked_cross_entropy.h"
#include "kernels/torch/paged_attention.h"
#include "worker/common/status.h"
#include "worker/data/sequence.h"
#include "worker/session/training_session.h"
#include "worker/train/chunk.h"
#include "worker/train/torch_status.h"

namespace oomb {
namespace {

void Sync(const at::Device& device) {
#if defined(OOMB_HAVE_CUDA)
  if (device.is_cuda()) at::cuda::getCurrentCUDAStream(device.index()).synchronize();
#endif
}

// Where and how often a part is timed; `should_stop` is asked between repetitions (CANCELLED).
struct Timing {
  at::Device device;
  int runs;
  const std::function<bool()>& should_stop;

  // The median seconds of `f` over `runs` runs after one warm-up.
  double MedianSeconds(const std::function<void()>& f) const {
    std::vector<double> t;
    for (int i = 0; i <= runs; ++i) {
      if (should_stop && should_stop()) throw StatusError(absl::CancelledError("the daemon is stopping"));
      const auto start = std::chrono::steady_clock::now();
      f();
      Sync(device);
      if (i > 0) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

std::string DeviceName(const at::Device& device) {
#if defined(OOMB_HAVE_CUDA)
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.index())->name;
#endif
  return absl::StrCat("cpu (", at::get_num_threads(), " threads)");
}

// How many layers the larger copy adds: enough that their weights (at least kUncachedBytes) do
// not stay in the CPU's caches between chunks, as a whole model's do not.
constexpr int64_t kUncachedBytes = int64_t{64} << 20;
constexpr int64_t kMaxDifferenceLayers = 8;
// On the CPU, the longest chunk timed and the longest past its attention is timed over (a
// 16K-token chunk through a few layers would take the CPU many minutes).
constexpr int64_t kCpuMeasuredChunk = 1024;
constexpr int64_t kCpuMeasuredPast = 4096;
constexpr int kMeasureAttempts = 5;
int64_t DifferenceLayers(const ModelConfig& config, const JobConfig& job) {
  const int64_t embeddings = config.vocab_size * config.hidden_size * (config.tie_word_embeddings ? 1 : 2);
  const int64_t layer_bytes = std::max<int64_t>(1, (config.ParameterCount() - embeddings) / config.num_layers) *
                              (job.model.dtype == ModelDtype::kFloat32 ? 4 : 2);
  return std::clamp<int64_t>((kUncachedBytes + layer_bytes - 1) / layer_bytes, 1,
                             std::max<int64_t>(1, config.num_layers - 1));
}

struct Measured {
  double forward_s = 0;  // without graph
  double train_s = 0;    // with graph, loss and backward
};

// One chunk through a copy of the model with `layers` decoder layers.
absl::StatusOr<Measured> MeasureModel(ModelConfig config, const JobConfig& job, int64_t layers, int64_t chunk_tokens,
                                      const ChunkTrainerOptions& trainer, const Timing& timing) {
  const at::Device& device = timing.device;
  config.num_layers = layers;
  if (config.sliding_layers.size() > static_cast<size_t>(layers)) config.sliding_layers.resize(layers);
  std::unique_ptr<Transformer> model = Transformer::Random(config, ModelScalarType(job), device, /*seed=*/1);
  OOMB_RETURN_IF_ERROR(PrepareTraining(*model, job));
  const at::Tensor ids = at::randint(0, config.vocab_size, {chunk_tokens + 1}, at::kLong);
  const TokenSequence seq = TokenSequence::FromDocument(
      std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + chunk_tokens + 1));
  const Chunk c = MakeChunk(*model, seq, 0, chunk_tokens, /*training=*/true, /*dropout_seed=*/1);
  const int64_t key_block = device.is_cuda() ? trainer.gpu_attention_key_block : trainer.attention_key_block;
  const AttentionFn attention = [&](int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return kernels::PagedAttention(q, k, v, c.doc_start_host, nullptr, key_block, trainer.gpu_attention_kernel, {},
                                   model->sinks(layer));
  };
  Measured m;
  m.forward_s = timing.MedianSeconds([&] {
    at::NoGradGuard no_grad;
    (void)model->Hidden(c.input, attention);
  });
  m.train_s = timing.MedianSeconds([&] {
    const at::Tensor hidden = model->Hidden(c.input, attention);
    const at::Tensor loss = model->LmHeadLoss(hidden, c.labels_host, trainer.ce_rows_per_block);
    torch::autograd::backward({loss});
  });
  return m;
}

// One layer's attention of a chunk over `past` tokens: forward, and forward + backward.
Measured MeasureAttention(const ModelConfig& config, at::ScalarType dtype, int64_t chunk_tokens, int64_t past,
                          const ChunkTrainerOptions& trainer, const Timing& timing) {
  const at::Device& device = timing.device;
  const auto opts = at::TensorOptions().dtype(dtype).device(device);
  const at::Tensor q = at::randn({chunk_tokens, config.num_heads, config.head_dim}, opts).requires_grad_();
  const at::Tensor k = at::randn({chunk_tokens, config.num_kv_heads, config.head_dim}, opts).requires_grad_();
  const at::Tensor v = at::randn({chunk_tokens, config.num_kv_heads, config.head_dim}, opts).requires_grad_();
  const at::Tensor past_k = at::randn({config.num_kv_heads, std::max<int64_t>(past, 1), config.head_dim}, opts);
  const at::Tensor past_v = at::randn_like(past_k);
  const at::Tensor doc_start = at::zeros({chunk_tokens}, at::kLong);
  const at::Tensor dout = at::randn({chunk_tokens, config.num_heads, config.head_dim}, opts);
  const int64_t key_block = device.is_cuda() ? trainer.gpu_attention_key_block : trainer.attention_key_block;
  const auto attend = [&] {
    std::shared_ptr<kernels::PastKv> p;
    if (past > 0) p = std::make_shared<kernels::TensorPast>(past_k, past_v);
    return kernels::PagedAttention(q, k, v, doc_start, std::move(p), key_block, trainer.gpu_attention_kernel);
  };
  Measured m;
  m.forward_s = timing.MedianSeconds([&] {
    at::NoGradGuard no_grad;
    (void)attend();
  });
  m.train_s = timing.MedianSeconds([&] { torch::autograd::backward({attend()}, {dout}); });
  return m;
}

double HostCopyBytesPerSecond(const Timing& timing) {
  const at::Device& device = timing.device;
  if (!device.is_cuda()) return 0;
  const int64_t bytes = int64_t{256} << 20;
  const at::Tensor host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  const at::Tensor dev = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  const double s = timing.MedianSeconds([&] {
    dev.copy_(host, /*non_blocking=*/true);
    host.copy_(dev, /*non_blocking=*/true);
  });
  return 2.0 * static_cast<double>(bytes) / s;
}

}  // namespace

absl::StatusOr<EngineRates> MeasureEngineRates(const ModelConfig& config, const JobConfig& job, int64_t chunk_tokens,
                                               const std::string& device_name,
                                               const std::function<bool()>& should_stop) {
  EngineRates rates;
  absl::Status s = Guarded(
      [&]() -> absl::Status {
        const at::Device device(device_name);
        const Timing timing{.device = device, .runs = device.is_cuda() ? 7 : 3, .should_stop = should_stop};
        const ChunkTrainerOptions trainer;
        const int64_t k = DifferenceLayers(config, job);
        // The chunk timed: the job's, or on the CPU at most kCpuMeasuredChunk tokens (scaled below).
        const int64_t c = device.is_cuda() ? chunk_tokens : std::min(chunk_tokens, kCpuMeasuredChunk);
        const int64_t past = device.is_cuda() ? kPastChunks * c : std::min(kPastChunks * c, kCpuMeasuredPast);
        Measured one, more, alone, with;
        // Differences of medians: noise on a busy machine can make one zero or negative, or a
        // layer's training look cheaper than its forward; such a measurement is taken again
        // (kMeasureAttempts in all). A difference still not positive counts as none, and a
        // layer's training as at least its forward.
        for (int attempt = 0; attempt < kMeasureAttempts; ++attempt) {
          OOMB_ASSIGN_OR_RETURN(one, MeasureModel(config, job, 1, c, trainer, timing));
          OOMB_ASSIGN_OR_RETURN(more, MeasureModel(config, job, 1 + k, c, trainer, timing));
          alone = MeasureAttention(config, ModelScalarType(job), c, 0, trainer, timing);
          with = MeasureAttention(config, ModelScalarType(job), c, past, trainer, timing);
          // A layer's training includes its forward, so its difference must be the larger.
          const bool positive =
              more.forward_s > one.forward_s && more.train_s - one.train_s > more.forward_s - one.forward_s &&
              with.forward_s > alone.forward_s && with.train_s - with.forward_s > alone.train_s - alone.forward_s;
          if (positive) break;
        }
        const double pairs = static_cast<double>(c) * static_cast<double>(past);
        rates.device_name = DeviceName(device);
        rates.chunk_tokens = chunk_tokens;
        rates.past_forward_s_per_pair = std::max(0.0, with.forward_s - alone.forward_s) / pairs;
        rates.past_backward_s_per_pair =
            std::max(0.0, (with.train_s - with.forward_s) - (alone.train_s - alone.forward_s)) / pairs;
        const double layer_forward_s = std::max(0.0, more.forward_s - one.forward_s) / static_cast<double>(k);
        const double layer_train_s =
            std::max(layer_forward_s, std::max(0.0, more.train_s - one.train_s) / static_cast<double>(k));
        // A longer chunk: the layers' per-token work grows with its tokens, and its own causal
        // attention by the pairs it adds, C (C - c) / 2, at the past's rate per pair.
        const double f = static_cast<double>(chunk_tokens) / static_cast<double>(c);
        const double added_pairs = static_cast<double>(chunk_tokens) * static_cast<double>(chunk_tokens - c) / 2;
        rates.layer_forward_s = layer_forward_s * f + added_pairs * rates.past_forward_s_per_pair;
        rates.layer_train_s =
            layer_train_s * f + added_pairs * (rates.past_forward_s_per_pair + rates.past_backward_s_per_pair);
        rates.head_train_s = std::max(0.0, one.train_s - layer_train_s) * f;
        rates.host_copy_bytes_per_s = HostCopyBytesPerSecond(timing);
        rates.measured_at = absl::FormatTime("%Y-%m-%d%ET%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
        return absl::OkStatus();
      },
      "measuring the device's rates");
  if (!s.ok()) return s;
  return rates;
}

std::string EngineRatesKey(const ModelConfig& config, const JobConfig& job, int64_t chunk_tokens,
                           const std::string& device) {
  const bool lora = job.method.type != TrainMethod::kFull;
  return absl::StrCat(
      DeviceName(at::Device(device)), "|", job.model.dtype == ModelDtype::kFloat32 ? "float32" : "bfloat16", "|",
      config.architecture, " v", config.vocab_size, " h", config.hidden_size, " i", config.intermediate_size, " a",
      config.num_heads, "/", config.num_kv_heads, "x", config.head_dim, config.tie_word_embeddings ? " tied" : "",
      "|chunk ", chunk_tokens, "|",
      lora ? absl::StrCat("lora r", job.method.lora.rank, " ", absl::StrJoin(job.method.lora.target_modules, ","))
           : "full");
}

}  // namespace oomb
