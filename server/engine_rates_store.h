// The device rates EstimateJob's time and cost come from (worker/plan/step_time.h): measured once
// per device model, model shape, dtype, method and chunk size (worker/job/calibration.h) and kept
// in <data_dir>/engine_rates.json, so a restart, or the next estimate of the same shape, reuses
// them. The first estimate of a new shape starts the measurement on a thread of its own and waits
// for it up to `wait` (the daemon's: none, so no RPC thread blocks; a GPU's measurement takes
// seconds, a CPU's up to minutes for long chunks); until it is done, Get is UNAVAILABLE with a
// message that begins "measuring" (`oomb estimate` asks again while it sees it). Measurements of
// the same shape are one; the destructor stops those running (CANCELLED).
//
// The file is a JSON object from the key (calibration.h's EngineRatesKey) to the rates' fields;
// it is rewritten atomically. Delete it, or an entry, to measure again (after a driver or
// library upgrade, say); an entry that cannot be read is measured again and replaced.
//
// Thread-safety: every method may be called from any thread.
#ifndef OOMB_SERVER_ENGINE_RATES_STORE_H_
#define OOMB_SERVER_ENGINE_RATES_STORE_H_

#include <atomic>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/common/file_access.h"
#include "worker/hf/model_config.h"
#include "worker/plan/job_config.h"
#include "worker/plan/step_time.h"

namespace oomb::server {

class EngineRatesStore {
 public:
  // (config, spec, chunk_tokens, device, should_stop): production's MeasureEngineRates and
  // EngineRatesKey.
  using Measure = std::function<absl::StatusOr<EngineRates>(const ModelConfig&, const JobConfig&, int64_t,
                                                            const std::string&, const std::function<bool()>&)>;
  using Key = std::function<std::string(const ModelConfig&, const JobConfig&, int64_t, const std::string&)>;

  EngineRatesStore(Dir data_dir, Measure measure, Key key, absl::Duration wait = absl::ZeroDuration());
  ~EngineRatesStore();

  // The rates of `job`'s model on `device` at chunks of `chunk_tokens`: kept ones, else
  // measured now (UNAVAILABLE while that takes longer than `wait`) and kept. A failed
  // measurement's error is returned once; the next call measures again.
  absl::StatusOr<EngineRates> Get(const ModelConfig& config, const JobConfig& job, int64_t chunk_tokens,
                                  const std::string& device);

  static constexpr char kFileName[] = "engine_rates.json";

 private:
  // Kept rates of `key`, or NOT_FOUND. Requires mu_.
  absl::StatusOr<EngineRates> Kept(const std::string& key) const;
  absl::Status Keep(const std::string& key, const EngineRates& rates);  // requires mu_

  const Dir data_dir_;
  const Measure measure_;
  const Key key_;
  const absl::Duration wait_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;  // guards the file and running_
  std::map<std::string, std::shared_future<absl::StatusOr<EngineRates>>> running_;
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_ENGINE_RATES_STORE_H_
