#include "server/metrics/scrape_collector.h"

#include <iterator>
#include <limits>
#include <map>
#include <tuple>

#include <spdlog/spdlog.h>

#include "server/metrics/exporter.h"

namespace oomb::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

MetricFamily NewFamily(const char* name, const char* help, MetricType type) {
  MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

void AddValue(MetricFamily* f, Labels labels, double value) {
  ClientMetric m;
  m.label = std::move(labels);
  if (f->type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f->metric.push_back(std::move(m));
}

constexpr Tier kTiers[] = {Tier::kDevice, Tier::kHost};
constexpr PageKind kKinds[] = {PageKind::kKv, PageKind::kKvGrad};  // of the page pools
// What the copy engine moves: the pools' pages and the attention results swapped to the host.
constexpr PageKind kTransferKinds[] = {PageKind::kKv, PageKind::kKvGrad, PageKind::kSwap};
constexpr TransferDirection kDirections[] = {TransferDirection::kHostToDevice, TransferDirection::kDeviceToHost};

}  // namespace

ScrapeCollector::ScrapeCollector(const MetricsExporterOptions& options) : options_(options) {
  if (!options_.nvml) return;
  absl::StatusOr<std::unique_ptr<Nvml>> nvml = Nvml::Open();
  if (nvml.ok()) {
    nvml_ = *std::move(nvml);
    spdlog::info("metrics: NVML loaded");
  } else {
    spdlog::info("metrics: no NVML ({}); device-wide GPU memory and PCIe counters are not exported",
                 std::string(nvml.status().message()));
  }
}

ScrapeCollector::~ScrapeCollector() = default;

std::vector<MetricFamily> ScrapeCollector::Collect() const {
  std::vector<MetricFamily> out;
  CollectJobs(&out);
  CollectProjects(&out);
  CollectDevices(&out);
  CollectKv(&out);
  return out;
}

void ScrapeCollector::CollectJobs(std::vector<MetricFamily>* out) const {
  if (!options_.count_jobs) return;
  absl::StatusOr<std::map<v1::Job::State, int64_t>> counts = options_.count_jobs();
  if (!counts.ok()) {
    spdlog::warn("metrics: counting jobs by state: {}", counts.status().ToString());
    return;
  }
  MetricFamily f = NewFamily("oomb_jobs", "Jobs in the store by state, now.", MetricType::Gauge);
  const google::protobuf::EnumDescriptor* states = v1::Job::State_descriptor();
  for (int i = 0; i < states->value_count(); ++i) {
    const auto state = static_cast<v1::Job::State>(states->value(i)->number());
    if (state == v1::Job::STATE_UNSPECIFIED) continue;
    auto it = counts->find(state);
    AddValue(&f, {{"state", states->value(i)->name()}}, it == counts->end() ? 0 : static_cast<double>(it->second));
  }
  out->push_back(std::move(f));
  if (!options_.pending_webhooks) return;
  absl::StatusOr<int64_t> pending = options_.pending_webhooks();
  if (!pending.ok()) {
    spdlog::warn("metrics: counting webhook messages: {}", pending.status().ToString());
    return;
  }
  MetricFamily outbox =
      NewFamily("oomb_webhook_outbox_messages",
                "Webhook messages waiting in the job store's outbox (not yet delivered), now.", MetricType::Gauge);
  AddValue(&outbox, {}, static_cast<double>(*pending));
  out->push_back(std::move(outbox));
}

void ScrapeCollector::CollectProjects(std::vector<MetricFamily>* out) const {
  if (!options_.projects) return;
  absl::StatusOr<std::vector<ProjectSample>> projects = options_.projects();
  if (!projects.ok()) {
    spdlog::warn("metrics: reading the projects' usage: {}", projects.status().ToString());
    return;
  }
  MetricFamily queued = NewFamily("oomb_project_queued_jobs", "The project's jobs in QUEUED, now.", MetricType::Gauge);
  MetricFamily running =
      NewFamily("oomb_project_running_devices", "Devices (GPUs) the project's running jobs hold, across the fleet.",
                MetricType::Gauge);
  MetricFamily hours = NewFamily("oomb_project_device_hours",
                                 "Device-hours the project's jobs ran in the last 24 hours (rolling), the running "
                                 "ones' so far included.",
                                 MetricType::Gauge);
  MetricFamily max_running =
      NewFamily("oomb_project_quota_running_devices",
                "The project's max_running_devices (tenancy.projects_file); absent: no limit.", MetricType::Gauge);
  MetricFamily max_hours =
      NewFamily("oomb_project_quota_device_hours",
                "The project's max_device_hours_per_day (tenancy.projects_file); absent: no limit.", MetricType::Gauge);
  MetricFamily max_queued =
      NewFamily("oomb_project_quota_queued_jobs",
                "The project's max_queued_jobs (VALIDATING, QUEUED, PAUSED); absent: no limit.", MetricType::Gauge);
  for (const ProjectSample& p : *projects) {
    const Labels labels = {{"project", p.project}};
    AddValue(&queued, labels, static_cast<double>(p.usage.queued_jobs));
    AddValue(&running, labels, static_cast<double>(p.usage.running_devices));
    AddValue(&hours, labels, p.usage.device_seconds_per_day / 3600);
    if (p.settings.max_running_devices > 0) {
      AddValue(&max_running, labels, static_cast<double>(p.settings.max_running_devices));
    }
    if (p.settings.max_device_hours_per_day > 0) AddValue(&max_hours, labels, p.settings.max_device_hours_per_day);
    if (p.settings.max_queued_jobs > 0) AddValue(&max_queued, labels, static_cast<double>(p.settings.max_queued_jobs));
  }
  for (MetricFamily* f : {&queued, &running, &hours, &max_running, &max_hours, &max_queued}) {
    out->push_back(std::move(*f));
  }
}

void ScrapeCollector::CollectDevices(std::vector<MetricFamily>* out) const {
  const std::vector<DeviceMemoryStats> devices =
      options_.device_memory ? options_.device_memory() : std::vector<DeviceMemoryStats>();
  std::map<std::string, NvmlDeviceSample> nvml;  // by UUID
  if (nvml_ != nullptr) {
    for (NvmlDeviceSample& s : nvml_->Sample()) nvml[s.uuid] = std::move(s);
  }

  MetricFamily allocated =
      NewFamily("oomb_gpu_memory_allocated_bytes",
                "Bytes in tensors on the device, from LibTorch's CUDA caching allocator.", MetricType::Gauge);
  MetricFamily reserved =
      NewFamily("oomb_gpu_memory_reserved_bytes",
                "Bytes the CUDA caching allocator holds from the driver (allocated plus cached).", MetricType::Gauge);
  MetricFamily peak =
      NewFamily("oomb_gpu_memory_peak_bytes",
                "Most bytes allocated at once since the current (or last) training step began.", MetricType::Gauge);
  MetricFamily retries =
      NewFamily("oomb_gpu_allocator_retries_total",
                "cudaMalloc failures the caching allocator retried after freeing its cache (memory pressure).",
                MetricType::Counter);
  MetricFamily ooms = NewFamily("oomb_gpu_allocator_ooms_total",
                                "Out-of-memory errors the CUDA caching allocator raised.", MetricType::Counter);
  MetricFamily used =
      NewFamily("oomb_gpu_memory_used_bytes", "Device memory in use by every process, from NVML.", MetricType::Gauge);
  MetricFamily total = NewFamily("oomb_gpu_memory_total_bytes", "Device memory, from NVML.", MetricType::Gauge);
  MetricFamily tx =
      NewFamily("oomb_gpu_pcie_tx_bytes_total",
                "Bytes the device sent over PCIe (device to host), all processes, from NVML.", MetricType::Counter);
  MetricFamily rx =
      NewFamily("oomb_gpu_pcie_rx_bytes_total",
                "Bytes the device received over PCIe (host to device), all processes, from NVML.", MetricType::Counter);
  MetricFamily link = NewFamily("oomb_gpu_pcie_link_bytes_per_second",
                                "Line rate of one direction of the device's PCIe link at its maximum generation "
                                "and width, from NVML.",
                                MetricType::Gauge);
  for (const DeviceMemoryStats& d : devices) {
    auto n = nvml.find(d.uuid);
    // DCGM's labels: `gpu` is NVML's index, which CUDA's may differ from.
    const Labels labels = {{"gpu", std::to_string(n != nvml.end() ? n->second.index : d.index)}, {"UUID", d.uuid}};
    AddValue(&allocated, labels, static_cast<double>(d.allocated_bytes));
    AddValue(&reserved, labels, static_cast<double>(d.reserved_bytes));
    AddValue(&peak, labels, static_cast<double>(d.peak_allocated_bytes));
    AddValue(&retries, labels, static_cast<double>(d.alloc_retries));
    AddValue(&ooms, labels, static_cast<double>(d.ooms));
    if (n == nvml.end()) continue;
    const NvmlDeviceSample& s = n->second;
    if (s.memory_used_bytes >= 0) AddValue(&used, labels, static_cast<double>(s.memory_used_bytes));
    if (s.memory_total_bytes >= 0) AddValue(&total, labels, static_cast<double>(s.memory_total_bytes));
    if (s.pcie_tx_bytes >= 0) AddValue(&tx, labels, static_cast<double>(s.pcie_tx_bytes));
    if (s.pcie_rx_bytes >= 0) AddValue(&rx, labels, static_cast<double>(s.pcie_rx_bytes));
    if (s.pcie_link_bytes_per_second >= 0) AddValue(&link, labels, static_cast<double>(s.pcie_link_bytes_per_second));
  }
  for (MetricFamily* f : {&allocated, &reserved, &peak, &retries, &ooms, &used, &total, &tx, &rx, &link}) {
    out->push_back(std::move(*f));
  }

  if (options_.pinned_host_bytes) {
    MetricFamily pinned = NewFamily("oomb_host_pinned_bytes",
                                    "Page-locked host memory held by LibTorch's CUDA host allocator (in use and "
                                    "cached); 0 without CUDA.",
                                    MetricType::Gauge);
    AddValue(&pinned, {}, static_cast<double>(options_.pinned_host_bytes()));
    out->push_back(std::move(pinned));
  }
}

void ScrapeCollector::CollectKv(std::vector<MetricFamily>* out) const {
  if (options_.kv_stats == nullptr) return;
  // Every slot shows every tier and kind, at zero where no pool lives (e.g. the host tier of a
  // job whose pages all fit on the device).
  struct Pages {
    int64_t capacity = 0, used = 0, peak = 0, used_bytes = 0, capacity_bytes = 0, peak_bytes = 0;
  };
  using PoolKey = std::tuple<std::string, Tier, PageKind>;
  std::map<PoolKey, Pages> pools;
  for (const std::string& slot : options_.slots) {
    for (Tier t : kTiers) {
      for (PageKind k : kKinds) pools[{slot, t, k}];
    }
  }
  for (const PoolSample& p : options_.kv_stats->Pools()) {
    Pages& a = pools[{p.slot, p.tier, p.kind}];
    a.capacity += p.capacity_pages;
    a.used += p.used_pages;
    a.peak += p.peak_pages;
    a.capacity_bytes += p.capacity_pages * p.bytes_per_page;
    a.used_bytes += p.used_pages * p.bytes_per_page;
    a.peak_bytes += p.peak_pages * p.bytes_per_page;
  }
  MetricFamily pages =
      NewFamily("oomb_kv_pages", "KV and KV-gradient pages by tier, kind and state (used, free).", MetricType::Gauge);
  MetricFamily bytes = NewFamily("oomb_kv_bytes", "Bytes in KV and KV-gradient pages in use.", MetricType::Gauge);
  MetricFamily capacity =
      NewFamily("oomb_kv_capacity_bytes", "Bytes of the KV and KV-gradient page arenas (allocated when a job starts).",
                MetricType::Gauge);
  MetricFamily peak = NewFamily("oomb_kv_peak_bytes",
                                "Most bytes in KV or KV-gradient pages at once during the current (or last) "
                                "training sequence.",
                                MetricType::Gauge);
  for (const auto& [key, a] : pools) {
    const auto& [slot, tier, kind] = key;
    const Labels labels = {{"slot", slot}, {"tier", TierName(tier)}, {"kind", KindName(kind)}};
    Labels used_labels = labels, free_labels = labels;
    used_labels.push_back({"state", "used"});
    free_labels.push_back({"state", "free"});
    AddValue(&pages, used_labels, static_cast<double>(a.used));
    AddValue(&pages, free_labels, static_cast<double>(a.capacity - a.used));
    AddValue(&bytes, labels, static_cast<double>(a.used_bytes));
    AddValue(&capacity, labels, static_cast<double>(a.capacity_bytes));
    AddValue(&peak, labels, static_cast<double>(a.peak_bytes));
  }
  for (MetricFamily* f : {&pages, &bytes, &capacity, &peak}) out->push_back(std::move(*f));

  using TransferKey = std::tuple<std::string, TransferDirection, PageKind>;
  std::map<TransferKey, TransferSample> transfers;
  for (const std::string& slot : options_.slots) {
    for (TransferDirection d : kDirections) {
      for (PageKind k : kTransferKinds) {
        TransferSample& t = transfers[{slot, d, k}];
        t.le.assign(std::size(KvStatsRegistry::kTransferBuckets), 0);
      }
    }
  }
  for (TransferSample& t : options_.kv_stats->Transfers()) transfers[{t.slot, t.direction, t.kind}] = std::move(t);
  MetricFamily moved =
      NewFamily("oomb_pcie_transfer_bytes_total",
                "Bytes of KV pages the copy engine moved between the device and host tiers.", MetricType::Counter);
  MetricFamily durations = NewFamily("oomb_pcie_transfer_duration_seconds",
                                     "Duration of the copy engine's page transfers.", MetricType::Histogram);
  for (const auto& [key, t] : transfers) {
    const auto& [slot, direction, kind] = key;
    const Labels labels = {{"slot", slot}, {"direction", DirectionName(direction)}, {"kind", KindName(kind)}};
    AddValue(&moved, labels, static_cast<double>(t.bytes));
    ClientMetric h;
    h.label = labels;
    h.histogram.sample_count = static_cast<uint64_t>(t.count);
    h.histogram.sample_sum = t.seconds_sum;
    for (size_t i = 0; i < t.le.size(); ++i) {
      h.histogram.bucket.push_back({static_cast<uint64_t>(t.le[i]), KvStatsRegistry::kTransferBuckets[i]});
    }
    h.histogram.bucket.push_back({static_cast<uint64_t>(t.count), std::numeric_limits<double>::infinity()});
    durations.metric.push_back(std::move(h));
  }
  out->push_back(std::move(moved));
  out->push_back(std::move(durations));
}

}  // namespace oomb::server
