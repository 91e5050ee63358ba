// The families of /metrics whose values are read when Prometheus scrapes (a
// prometheus::Collectable; no polling thread): jobs by state, projects' usage and quotas, device memory (CUDA caching
// allocator, NVML), NVML's PCIe counters, KV pages and transfers, pinned host memory. Names,
// units and labels: docs/metrics.md.
//
// Thread-safety: Collect() may run on several scrape threads at once.
#ifndef OOMB_SERVER_METRICS_SCRAPE_COLLECTOR_H_
#define OOMB_SERVER_METRICS_SCRAPE_COLLECTOR_H_

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <memory>
#include <string>
#include <vector>

#include "worker/metrics/nvml.h"

namespace oomb::server {

struct MetricsExporterOptions;

class ScrapeCollector final : public prometheus::Collectable {
 public:
  // `options` must outlive the collector; NVML is opened here when options.nvml is set and the
  // library is present.
  explicit ScrapeCollector(const MetricsExporterOptions& options);
  ~ScrapeCollector() override;

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  void CollectJobs(std::vector<prometheus::MetricFamily>* out) const;
  void CollectProjects(std::vector<prometheus::MetricFamily>* out) const;
  void CollectDevices(std::vector<prometheus::MetricFamily>* out) const;
  void CollectKv(std::vector<prometheus::MetricFamily>* out) const;

  const MetricsExporterOptions& options_;
  std::unique_ptr<Nvml> nvml_;  // null without NVML
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_METRICS_SCRAPE_COLLECTOR_H_
