// What this build of oomb runs on: versions, visible devices, and the devices' memory as
// LibTorch's allocators see it. Torch-free header, so the daemon and other gRPC code can
// include it (see worker/CMakeLists.txt on include hygiene).
#ifndef OOMB_WORKER_JOB_BUILD_INFO_H_
#define OOMB_WORKER_JOB_BUILD_INFO_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/plan/memory_planner.h"

namespace oomb {

struct DeviceInfo {
  std::string name;   // "cpu", "cuda:0"
  std::string model;  // "NVIDIA H100 80GB HBM3"; the CPU: empty
  int64_t memory_bytes = 0;
  std::string uuid;            // "GPU-8c6e5a8e-..." as NVML and DCGM spell it; the CPU: empty
  int compute_capability = 0;  // major * 10 + minor (90: Hopper); the CPU: 0
};

struct BuildInfo {
  std::string version;              // oomb's version
  std::string git_sha;              // the commit built ("0123abcd4567", "-dirty" appended); "unknown"
  std::string torch_version;        // LibTorch's, e.g. "2.11.0"
  std::string cuda_version;         // CUDA runtime LibTorch was built with; empty without CUDA
  bool cuda_compiled = false;       // kernels/ was compiled with nvcc
  std::vector<DeviceInfo> devices;  // "cpu" first, then every visible CUDA device
};

// Reads the versions and enumerates devices. Thread-safe. Does not initialise a CUDA context
// beyond what device enumeration needs.
BuildInfo GetBuildInfo();

// This machine as the memory planner sees it for a job on `device` ("cpu", "cuda:0"): the
// device's memory and the host's, from GetBuildInfo().
PlanTarget ThisMachine(const std::string& device);

// The commit this binary was built from (written at build time by cmake/GitSha.cmake).
const char* BuildGitSha();

// How the devices of each tensor-parallel group reach each other, in words, for the run's log:
// the groups (`devices`, "cpu" or "cuda:N" in rank order, in groups of `tensor`) and, on GPUs,
// "NVLink between every pair of a group" or the pairs that are not ("cuda:0-cuda:2 without
// NVLink (PCIe or the host)"), or why that is unknown. `nvlinked(a, b)` answers for CUDA indices
// a and b (TensorParallelLinks: NVML's peer-to-peer status).
using NvLinkQuery = std::function<absl::StatusOr<bool>(int a, int b)>;
std::string DescribeTensorParallelLinks(const std::vector<std::string>& devices, int tensor,
                                        const NvLinkQuery& nvlinked);
std::string TensorParallelLinks(const std::vector<std::string>& devices, int tensor);

// One CUDA device's memory as LibTorch's caching allocator accounts it.
struct DeviceMemoryStats {
  int index = 0;                     // CUDA's device index ("cuda:N")
  std::string uuid;                  // as DeviceInfo::uuid
  int64_t allocated_bytes = 0;       // in tensors now
  int64_t reserved_bytes = 0;        // held from the driver (allocated + cached)
  int64_t peak_allocated_bytes = 0;  // since the last peak reset (the executor resets it every step)
  int64_t alloc_retries = 0;         // cudaMalloc failures retried after freeing the cache (cumulative)
  int64_t ooms = 0;                  // out-of-memory errors raised (cumulative)
};

// Every CUDA device of this process; empty without CUDA at run time. Thread-safe and cheap (no
// device synchronisation): called at every scrape of /metrics.
std::vector<DeviceMemoryStats> GetDeviceMemoryStats();

// Page-locked host memory held by LibTorch's CUDA host allocator (in use and cached); 0
// without CUDA at run time. Thread-safe.
int64_t GetPinnedHostBytes();

}  // namespace oomb

#endif  // OOMB_WORKER_JOB_BUILD_INFO_H_
