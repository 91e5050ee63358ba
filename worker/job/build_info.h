// What this build of oomb runs on: versions and visible devices. Torch-free header, so the
// daemon and other gRPC code can include it (see worker/CMakeLists.txt on include hygiene).
#ifndef OOMB_WORKER_JOB_BUILD_INFO_H_
#define OOMB_WORKER_JOB_BUILD_INFO_H_

#include <cstdint>
#include <string>
#include <vector>

namespace oomb {

struct DeviceInfo {
  std::string name;   // "cpu", "cuda:0"
  std::string model;  // "NVIDIA H100 80GB HBM3"; the CPU: empty
  int64_t memory_bytes = 0;
};

struct BuildInfo {
  std::string version;              // oomb's version
  std::string torch_version;        // LibTorch's, e.g. "2.11.0"
  std::string cuda_version;         // CUDA runtime LibTorch was built with; empty without CUDA
  bool cuda_compiled = false;       // kernels/ was compiled with nvcc
  std::vector<DeviceInfo> devices;  // "cpu" first, then every visible CUDA device
};

// Reads the versions and enumerates devices. Thread-safe. Does not initialise a CUDA context
// beyond what device enumeration needs.
BuildInfo GetBuildInfo();

}  // namespace oomb

#endif  // OOMB_WORKER_JOB_BUILD_INFO_H_
