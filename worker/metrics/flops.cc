#include "worker/metrics/flops.h"

namespace oomb {

double PeakDenseBf16Flops(std::string_view device_name) {
  // First match wins: variants before the family name they contain.
  struct Entry {
    const char* contains;
    double flops;
  };
  static constexpr Entry kTable[] = {
      {"GH200", 989.4e12},   {"H200 NVL", 835e12}, {"H200", 989.4e12}, {"H100 NVL", 835e12},
      {"H100 PCIe", 756e12}, {"H100", 989.4e12},   {"H800", 989.4e12}, {"B200", 2250e12},
      {"A100", 312e12},      {"A800", 312e12},     {"L40S", 362e12},
  };
  for (const Entry& e : kTable) {
    if (device_name.find(e.contains) != std::string_view::npos) return e.flops;
  }
  return 0;
}

double ModelFlopsUtilization(double model_flops, double seconds, double peak_flops, int64_t devices) {
  if (peak_flops <= 0 || seconds <= 0 || devices <= 0) return 0;
  return model_flops / seconds / (peak_flops * static_cast<double>(devices));
}

double FrozenBaseFlops(double model_flops, double active_parameters, double tokens) {
  return model_flops - 2.0 * active_parameters * tokens;
}

}  // namespace oomb
