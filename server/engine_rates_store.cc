#include "server/engine_rates_store.h"

#include <nlohmann/json.hpp>

#include <utility>

#include "absl/strings/str_cat.h"

#include "spdlog/spdlog.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

using json = nlohmann::json;

json ToJson(const EngineRates& r) {
  return {{"device_name", r.device_name},
          {"measured_at", r.measured_at},
          {"chunk_tokens", r.chunk_tokens},
          {"layer_forward_s", r.layer_forward_s},
          {"layer_train_s", r.layer_train_s},
          {"head_train_s", r.head_train_s},
          {"past_forward_s_per_pair", r.past_forward_s_per_pair},
          {"past_backward_s_per_pair", r.past_backward_s_per_pair},
          {"host_copy_bytes_per_s", r.host_copy_bytes_per_s}};
}

EngineRates FromJson(const json& j) {
  EngineRates r;
  r.device_name = j.at("device_name").get<std::string>();
  r.measured_at = j.at("measured_at").get<std::string>();
  r.chunk_tokens = j.at("chunk_tokens").get<int64_t>();
  r.layer_forward_s = j.at("layer_forward_s").get<double>();
  r.layer_train_s = j.at("layer_train_s").get<double>();
  r.head_train_s = j.at("head_train_s").get<double>();
  r.past_forward_s_per_pair = j.at("past_forward_s_per_pair").get<double>();
  r.past_backward_s_per_pair = j.at("past_backward_s_per_pair").get<double>();
  r.host_copy_bytes_per_s = j.at("host_copy_bytes_per_s").get<double>();
  return r;
}

}  // namespace

EngineRatesStore::EngineRatesStore(Dir data_dir, Measure measure, Key key, absl::Duration wait)
    : data_dir_(std::move(data_dir)), measure_(std::move(measure)), key_(std::move(key)), wait_(wait) {}

EngineRatesStore::~EngineRatesStore() {
  stopping_ = true;
  std::map<std::string, std::shared_future<absl::StatusOr<EngineRates>>> running;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running.swap(running_);
  }
  for (auto& [key, measurement] : running) measurement.wait();  // they take mu_ to keep what they measured
}

absl::StatusOr<EngineRates> EngineRatesStore::Kept(const std::string& key) const {
  absl::StatusOr<std::string> text = data_dir_.ReadFile(kFileName, int64_t{16} << 20);
  if (absl::IsNotFound(text.status())) return absl::NotFoundError(absl::StrCat("no rates of ", key));  // none yet
  if (!text.ok()) return text.status();
  const json kept = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!kept.is_object()) return absl::NotFoundError(absl::StrCat(data_dir_.PathOf(kFileName), ": not a JSON object"));
  const auto it = kept.find(key);
  if (it == kept.end()) return absl::NotFoundError(absl::StrCat("no rates of ", key));
  try {
    return FromJson(*it);
  } catch (const json::exception& e) {
    return absl::NotFoundError(absl::StrCat("entry '", key, "' unreadable (", e.what(), ")"));
  }
}

absl::Status EngineRatesStore::Keep(const std::string& key, const EngineRates& rates) {
  json kept = json::object();
  if (absl::StatusOr<std::string> text = data_dir_.ReadFile(kFileName, int64_t{16} << 20); text.ok()) {
    kept = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!kept.is_object()) kept = json::object();
  }
  kept[key] = ToJson(rates);
  return data_dir_.WriteFileAtomic(kFileName, kept.dump(2) + "\n", 0600);
}

absl::StatusOr<EngineRates> EngineRatesStore::Get(const ModelConfig& config, const JobConfig& job, int64_t chunk_tokens,
                                                  const std::string& device) {
  const std::string key = key_(config, job, chunk_tokens, device);
  std::shared_future<absl::StatusOr<EngineRates>> running;
  {
    std::lock_guard<std::mutex> lock(mu_);
    absl::StatusOr<EngineRates> kept = Kept(key);
    if (kept.ok() || !absl::IsNotFound(kept.status())) return kept;
    if (kept.status().message() != absl::StrCat("no rates of ", key)) {
      spdlog::warn("{}: {}; measuring again", data_dir_.PathOf(kFileName), std::string(kept.status().message()));
    }
    auto it = running_.find(key);
    if (it == running_.end()) {
      spdlog::info("measuring the engine's rates for {}", key);
      auto measure = [this, config, job, chunk_tokens, device, key]() -> absl::StatusOr<EngineRates> {
        absl::StatusOr<EngineRates> rates =
            measure_(config, job, chunk_tokens, device, [this] { return stopping_.load(); });
        if (!rates.ok()) return rates;
        std::lock_guard<std::mutex> lock(mu_);
        OOMB_RETURN_IF_ERROR(Keep(key, *rates));
        spdlog::info("kept the engine's rates for {} in {}", key, data_dir_.PathOf(kFileName));
        return rates;
      };
      it = running_.emplace(key, std::async(std::launch::async, std::move(measure)).share()).first;
    }
    running = it->second;
  }
  if (running.wait_for(absl::ToChronoMilliseconds(wait_)) != std::future_status::ready) {
    return absl::UnavailableError(absl::StrCat("measuring the rates of this model shape on ", device,
                                               " (seconds on a GPU, minutes on a CPU); ask again shortly"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = running_.find(key);
      it != running_.end() && it->second.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    running_.erase(it);  // a failed measurement is tried again by the next call
  }
  return running.get();
}

}  // namespace oomb::server
