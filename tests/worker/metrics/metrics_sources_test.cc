// The torch-free metric sources: the KV stats registry, MFU arithmetic, PCIe line rates,
// NVML's graceful absence (CPU machines) or presence (GPU machines), and metrics.jsonl read back
// as Hugging Face's TrainerState.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/worker/test_files.h"
#include "worker/metrics/flops.h"
#include "worker/metrics/kv_stats.h"
#include "worker/metrics/metrics_log.h"
#include "worker/metrics/nvml.h"

namespace oomb {
namespace {

TEST(KvStatsRegistryTest, PoolsAreLiveWhileTheirCountersLive) {
  KvStatsRegistry r;
  std::shared_ptr<PoolCounters> kv = r.AddPool("cuda:0", Tier::kDevice, PageKind::kKv, 100, 4096);
  std::shared_ptr<PoolCounters> grad = r.AddPool("cuda:0", Tier::kDevice, PageKind::kKvGrad, 100, 8192);
  kv->Set(/*used_pages=*/30, /*peak_pages=*/40);
  grad->Set(5, 7);
  std::vector<PoolSample> pools = r.Pools();
  ASSERT_EQ(pools.size(), 2u);
  EXPECT_EQ(pools[0].slot, "cuda:0");
  EXPECT_EQ(pools[0].kind, PageKind::kKv);
  EXPECT_EQ(pools[0].capacity_pages, 100);
  EXPECT_EQ(pools[0].used_pages, 30);
  EXPECT_EQ(pools[0].peak_pages, 40);
  EXPECT_EQ(pools[0].bytes_per_page, 4096);
  EXPECT_EQ(pools[1].kind, PageKind::kKvGrad);
  EXPECT_EQ(pools[1].peak_pages, 7);
  kv.reset();  // the pool (and its job) ended
  pools = r.Pools();
  ASSERT_EQ(pools.size(), 1u);
  EXPECT_EQ(pools[0].kind, PageKind::kKvGrad);
}

TEST(KvStatsRegistryTest, CountersAreWrittenAndReadFromDifferentThreads) {
  KvStatsRegistry r;
  std::shared_ptr<PoolCounters> c = r.AddPool("cpu", Tier::kDevice, PageKind::kKv, 1000, 1);
  std::thread writer([&] {
    for (int i = 0; i <= 1000; ++i) c->Set(i, i);
  });
  for (int i = 0; i < 100; ++i) {
    for (const PoolSample& p : r.Pools()) EXPECT_LE(p.used_pages, 1000);
  }
  writer.join();
  EXPECT_EQ(r.Pools()[0].used_pages, 1000);
}

TEST(KvStatsRegistryTest, TransfersAccumulateIntoCumulativeBuckets) {
  KvStatsRegistry r;
  EXPECT_TRUE(r.Transfers().empty());
  r.RecordTransfer("cuda:0", TransferDirection::kDeviceToHost, PageKind::kKv, 65536, 3e-6);
  r.RecordTransfer("cuda:0", TransferDirection::kDeviceToHost, PageKind::kKv, 65536, 0.3);
  r.RecordTransfer("cuda:0", TransferDirection::kHostToDevice, PageKind::kKvGrad, 100, 10.0);
  const std::vector<TransferSample> t = r.Transfers();
  ASSERT_EQ(t.size(), 2u);
  const TransferSample& d2h = t[0].direction == TransferDirection::kDeviceToHost ? t[0] : t[1];
  const TransferSample& h2d = t[0].direction == TransferDirection::kDeviceToHost ? t[1] : t[0];
  EXPECT_EQ(d2h.bytes, 131072);
  EXPECT_EQ(d2h.count, 2);
  EXPECT_DOUBLE_EQ(d2h.seconds_sum, 0.300003);
  ASSERT_EQ(d2h.le.size(), std::size(KvStatsRegistry::kTransferBuckets));
  // 3 us falls in the 5 us bucket and every larger one; 0.3 s from the 0.5 s bucket on.
  EXPECT_THAT(d2h.le, ::testing::ElementsAre(0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2));
  EXPECT_EQ(h2d.kind, PageKind::kKvGrad);
  EXPECT_EQ(h2d.count, 1);
  EXPECT_THAT(h2d.le, ::testing::Each(0));  // slower than the largest bound: only in +Inf (count)
  EXPECT_STREQ(DirectionName(TransferDirection::kHostToDevice), "h2d");
  EXPECT_STREQ(DirectionName(TransferDirection::kDeviceToHost), "d2h");
}

TEST(FlopsTest, PeaksOfKnownDevicesAndNoneForOthers) {
  EXPECT_DOUBLE_EQ(PeakDenseBf16Flops("NVIDIA H100 80GB HBM3"), 989.4e12);
  EXPECT_DOUBLE_EQ(PeakDenseBf16Flops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_DOUBLE_EQ(PeakDenseBf16Flops("NVIDIA H200"), 989.4e12);
  EXPECT_DOUBLE_EQ(PeakDenseBf16Flops("NVIDIA H200 NVL"), 835e12);
  EXPECT_DOUBLE_EQ(PeakDenseBf16Flops("NVIDIA GH200 480GB"), 989.4e12);
  EXPECT_DOUBLE_EQ(PeakDenseBf16Flops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_EQ(PeakDenseBf16Flops("NVIDIA GeForce RTX 4090"), 0);
  EXPECT_EQ(PeakDenseBf16Flops(""), 0);
}

// The one MFU definition: model FLOPs over seconds and the devices' datasheet peaks, never a
// matmul rate measured on the machine: 492.63 model TFLOP/s on an H100 is 49.8%.
TEST(FlopsTest, MfuIsOverTheDatasheetPeakOfEveryDevice) {
  EXPECT_NEAR(ModelFlopsUtilization(492.63e12, 1.0, PeakDenseBf16Flops("NVIDIA H100 80GB HBM3")), 0.4979, 5e-4);
  EXPECT_DOUBLE_EQ(ModelFlopsUtilization(989.4e12 * 8, 2.0, 989.4e12, 4), 1.0);
  EXPECT_EQ(ModelFlopsUtilization(1e12, 1.0, 0), 0);  // the CPU, an unlisted GPU: no MFU
  EXPECT_EQ(ModelFlopsUtilization(1e12, 0.0, 989.4e12), 0);
  EXPECT_EQ(ModelFlopsUtilization(1e12, 1.0, 989.4e12, 0), 0);
  // LoRA's count without the frozen base's weight gradients: 6 N T - 2 N T.
  EXPECT_DOUBLE_EQ(FrozenBaseFlops(6.0 * 7e9 * 1000 + 5e12, 7e9, 1000), 4.0 * 7e9 * 1000 + 5e12);
}

TEST(NvmlTest, PcieLineRates) {
  EXPECT_EQ(PcieLinkBytesPerSecond(5, 16), 63015384615);  // 32 GT/s * 128/130 / 8 * 16
  EXPECT_EQ(PcieLinkBytesPerSecond(4, 16), 31507692307);
  EXPECT_EQ(PcieLinkBytesPerSecond(3, 8), 7876923076);
  EXPECT_EQ(PcieLinkBytesPerSecond(1, 1), 250000000);
  EXPECT_EQ(PcieLinkBytesPerSecond(9, 16), -1);
  EXPECT_EQ(PcieLinkBytesPerSecond(5, 0), -1);
}

// Without the NVIDIA driver (CPU machines) NVML is UNAVAILABLE and nothing else breaks; with
// it, every device has an NVML UUID and memory numbers.
TEST(NvmlTest, OpensWhereTheDriverIsAndFailsCleanlyElsewhere) {
  absl::StatusOr<std::unique_ptr<Nvml>> nvml = Nvml::Open();
  if (!nvml.ok()) {
    EXPECT_EQ(nvml.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(std::string(nvml.status().message()), ::testing::HasSubstr("NVML"));
    return;
  }
  for (const NvmlDeviceSample& s : (*nvml)->Sample()) {
    EXPECT_THAT(s.uuid, ::testing::StartsWith("GPU-"));
    EXPECT_GT(s.memory_total_bytes, 0);
    EXPECT_GE(s.memory_used_bytes, 0);
  }
}

// trainer_state.json in Hugging Face's schema from metrics.jsonl: the steps up to the
// checkpoint's, the newer line of a step logged twice (a resumed run), the evaluation's entries
// after their step, a torn last line skipped.
TEST(MetricsLogTest, HfTrainerStateFromTheLog) {
  const std::string path = ::testing::TempDir() + "/hf_state_" + std::to_string(::getpid());
  std::filesystem::remove_all(path);
  const Dir dir = testing::MakeDirs(path);
  {
    absl::StatusOr<MetricsLog> log = MetricsLog::Open(dir);
    ASSERT_TRUE(log.ok()) << log.status();
    const auto step = [&](int64_t n, double loss, int64_t tokens) {
      StepReport r;
      r.step = n;
      r.loss = loss;
      r.learning_rate = 1e-3 * static_cast<double>(n);
      r.tokens = tokens;
      r.model_flops = 1e9 * static_cast<double>(n);
      return r;
    };
    ASSERT_TRUE(log->Append(step(1, 3.0, 100)).ok());
    ASSERT_TRUE(log->Append(step(2, 2.9, 200)).ok());
    ASSERT_TRUE(log->Append(step(3, 2.8, 300)).ok());  // after the checkpoint at 2: the run died
    StepReport again = step(2, 2.5, 200);              // the resumed run's step 2
    again.eval_loss = 2.25;
    again.evaluation = EvalReport{{EvalSuite::kPasskey, SuiteResult{.buckets = {}, .cells = {{4096, 0.5, 1, 2}}}}};
    ASSERT_TRUE(log->Append(again).ok());
  }
  {
    absl::StatusOr<UniqueFd> fd = dir.OpenAppend(MetricsLog::kFileName);
    ASSERT_TRUE(fd.ok());
    ASSERT_EQ(::write(fd->get(), "{\"step\": 4, \"lo", 15), 15);
  }
  absl::StatusOr<nlohmann::json> state = MetricsLog::HfTrainerState(dir, {.global_step = 2,
                                                                          .epoch = 0,
                                                                          .max_steps = 10,
                                                                          .num_train_epochs = 0,
                                                                          .train_batch_size = 2,
                                                                          .save_steps = 2,
                                                                          .eval_steps = 2,
                                                                          .num_input_tokens_seen = 200});
  ASSERT_TRUE(state.ok()) << state.status();
  const nlohmann::json& j = *state;
  EXPECT_EQ(j["global_step"], 2);
  EXPECT_EQ(j["max_steps"], 10);
  EXPECT_EQ(j["train_batch_size"], 2);
  EXPECT_EQ(j["num_input_tokens_seen"], 200);
  EXPECT_EQ(j["total_flos"], 1e9 + 2e9);  // steps 1 and 2 (the resumed one's), not 3
  const nlohmann::json& log = j["log_history"];
  ASSERT_EQ(log.size(), 3u) << log.dump(2);
  EXPECT_EQ(log[0],
            (nlohmann::json{{"step", 1}, {"loss", 3.0}, {"learning_rate", 1e-3}, {"num_input_tokens_seen", 100}}));
  EXPECT_EQ(log[1]["step"], 2);
  EXPECT_EQ(log[1]["loss"], 2.5);
  EXPECT_EQ(log[2], (nlohmann::json{{"step", 2}, {"eval_loss", 2.25}, {"eval_passkey_accuracy", 0.5}}));
  std::filesystem::remove_all(path);
}

}  // namespace
}  // namespace oomb
