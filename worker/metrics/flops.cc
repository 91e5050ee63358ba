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

}  // namespace oomb
