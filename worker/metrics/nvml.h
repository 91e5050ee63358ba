// NVML (the NVIDIA Management Library) loaded at run time, for the device-wide numbers /metrics
// shows beside oomb's own: framebuffer memory used and total, and the PCIe byte counters.
//
// Build machines have neither nvml.h nor libnvidia-ml (docs/CONVENTIONS.md §1): the library is
// opened with dlopen("libnvidia-ml.so.1") and the few entry points used are declared in
// nvml.cc. Without the library (no NVIDIA driver: CPU machines) Open() fails and the caller
// goes on without NVML.
//
// Indices are NVML's (PCI bus order), which is what DCGM's `gpu` label means; CUDA's order may
// differ (CUDA_DEVICE_ORDER), so join with CUDA devices by UUID.
//
// Thread-safety: Sample() may be called from any thread.
#ifndef OOMB_WORKER_METRICS_NVML_H_
#define OOMB_WORKER_METRICS_NVML_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace oomb {

// One device at one moment. A value NVML cannot give on this device (e.g. the PCIe counters
// before driver R550, or on a MIG instance) is -1.
struct NvmlDeviceSample {
  int index = 0;     // NVML's index: DCGM's `gpu` label
  std::string uuid;  // "GPU-8c6e5a8e-...": DCGM's `UUID` label
  int64_t memory_used_bytes = -1;
  int64_t memory_total_bytes = -1;
  // Cumulative bytes over the PCIe link since the driver loaded, from the device's point of
  // view: tx = device to host, rx = host to device (NVML field ids 197 and 198). NVML's
  // counters may wrap; these are extended so they only grow while this object lives.
  int64_t pcie_tx_bytes = -1;
  int64_t pcie_rx_bytes = -1;
  // Line rate of one direction of the link at the highest generation and width the device and
  // the slot support, after encoding (Gen5 x16: 63.0 GB/s; copies reach somewhat less).
  int64_t pcie_link_bytes_per_second = -1;
};

class Nvml {
 public:
  // Loads libnvidia-ml.so.1 and calls nvmlInit. UNAVAILABLE naming the reason when the library
  // is missing, lacks an entry point, or NVML does not initialise.
  static absl::StatusOr<std::unique_ptr<Nvml>> Open();
  ~Nvml();  // nvmlShutdown, dlclose
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // Every device NVML sees; a device NVML cannot open is left out.
  std::vector<NvmlDeviceSample> Sample();

  // Whether the devices of these UUIDs reach each other over NVLink (NVML's peer-to-peer status
  // for NVLink, nvmlDeviceGetP2PStatus); UNAVAILABLE when NVML cannot say (a device it does not
  // know, a driver without the query).
  absl::StatusOr<bool> NvLinked(const std::string& uuid_a, const std::string& uuid_b);

 private:
  struct Api;  // the entry points (nvml.cc)
  // A counter NVML reports raw, made monotonic across wraps and resets.
  struct Extended {
    bool seen = false;
    uint64_t last_raw = 0;
    uint64_t offset = 0;
  };
  Nvml(void* library, std::unique_ptr<Api> api);
  static uint64_t Extend(Extended* c, uint64_t raw, uint64_t modulus);

  void* library_;
  std::unique_ptr<Api> api_;
  absl::Mutex mu_;
  std::map<std::pair<std::string, int>, Extended> counters_ ABSL_GUARDED_BY(mu_);  // (uuid, field id)
};

// The line rate of one direction of a PCIe link, after encoding; -1 for an unknown generation.
int64_t PcieLinkBytesPerSecond(unsigned generation, unsigned width);

}  // namespace oomb

#endif  // OOMB_WORKER_METRICS_NVML_H_
