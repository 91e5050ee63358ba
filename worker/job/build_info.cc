#include "worker/job/build_info.h"

#include <unistd.h>

#include <ATen/core/CachingHostAllocator.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <cstdio>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "worker/metrics/nvml.h"

#if defined(OOMB_HAVE_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace oomb {
namespace {

#if defined(OOMB_HAVE_CUDA)
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", NVML's spelling of the device's UUID.
std::string FormatUuid(const cudaUUID_t& uuid) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  char out[64];
  std::snprintf(out, sizeof out, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return out;
}

// The UUIDs of the visible CUDA devices, by CUDA index; read once (cudaGetDeviceProperties
// takes milliseconds).
const std::vector<std::string>& CudaUuids() {
  static const std::vector<std::string>* const kUuids = [] {
    auto* uuids = new std::vector<std::string>();
    const int n = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
    for (int i = 0; i < n; ++i) {
      cudaDeviceProp prop{};
      uuids->push_back(cudaGetDeviceProperties(&prop, i) == cudaSuccess ? FormatUuid(prop.uuid) : "");
    }
    return uuids;
  }();
  return *kUuids;
}
#endif

}  // namespace

BuildInfo GetBuildInfo() {
  BuildInfo info;
  info.version = "0.1.0";
  info.git_sha = BuildGitSha();
  info.torch_version = TORCH_VERSION;
  DeviceInfo cpu;
  cpu.name = "cpu";
  cpu.memory_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  info.devices.push_back(cpu);
#if defined(OOMB_HAVE_CUDA)
  info.cuda_compiled = true;
  info.cuda_version = std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
  const int n = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    DeviceInfo d;
    d.name = "cuda:" + std::to_string(i);
    d.model = prop.name;
    d.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    d.uuid = FormatUuid(prop.uuid);
    d.compute_capability = prop.major * 10 + prop.minor;
    info.devices.push_back(d);
  }
#endif
  return info;
}

std::string DescribeTensorParallelLinks(const std::vector<std::string>& devices, int tensor,
                                        const NvLinkQuery& nvlinked) {
  std::vector<std::string> groups, without, unknown;
  for (size_t g = 0; g + tensor <= devices.size(); g += tensor) {
    groups.push_back(absl::StrJoin(devices.begin() + g, devices.begin() + g + tensor, ", "));
    for (size_t i = g; i < g + tensor; ++i) {
      for (size_t j = i + 1; j < g + tensor; ++j) {
        int a = 0, b = 0;
        if (!absl::SimpleAtoi(absl::StripPrefix(devices[i], "cuda:"), &a) ||
            !absl::SimpleAtoi(absl::StripPrefix(devices[j], "cuda:"), &b)) {
          continue;  // CPU ranks
        }
        const absl::StatusOr<bool> linked = nvlinked(a, b);
        if (!linked.ok()) {
          unknown.push_back(std::string(linked.status().message()));
        } else if (!*linked) {
          without.push_back(absl::StrCat(devices[i], "-", devices[j]));
        }
      }
    }
  }
  std::string out = absl::StrCat("tensor parallel: ", groups.size(), groups.size() == 1 ? " group" : " groups", " of ",
                                 tensor, " ranks (", absl::StrJoin(groups, " | "), ")");
  if (absl::StartsWith(devices.front(), "cpu")) return absl::StrCat(out, ", Gloo over loopback");
  if (!unknown.empty()) return absl::StrCat(out, ", links unknown (", unknown.front(), ")");
  if (without.empty()) return absl::StrCat(out, ", NVLink between every pair of a group (NCCL)");
  return absl::StrCat(out, ", without NVLink (PCIe or the host) between ", absl::StrJoin(without, ", "),
                      ": each layer's sums cross that link (NCCL)");
}

std::string TensorParallelLinks(const std::vector<std::string>& devices, int tensor) {
  std::unique_ptr<Nvml> nvml;
  absl::Status opened = absl::OkStatus();
  if (!devices.empty() && !absl::StartsWith(devices.front(), "cpu")) {
    absl::StatusOr<std::unique_ptr<Nvml>> n = Nvml::Open();
    if (n.ok()) nvml = *std::move(n);
    opened = n.status();
  }
  return DescribeTensorParallelLinks(devices, tensor, [&](int a, int b) -> absl::StatusOr<bool> {
    if (nvml == nullptr) return opened;
#if defined(OOMB_HAVE_CUDA)
    const std::vector<std::string>& uuids = CudaUuids();
    if (a >= static_cast<int>(uuids.size()) || b >= static_cast<int>(uuids.size())) {
      return absl::UnavailableError("a device CUDA does not see");
    }
    return nvml->NvLinked(uuids[a], uuids[b]);
#else
    return absl::UnavailableError("a build without CUDA");
#endif
  });
}

PlanTarget ThisMachine(const std::string& device) {
  PlanTarget target{.device = device};
  for (const DeviceInfo& d : GetBuildInfo().devices) {
    if (d.name == "cpu") target.host_bytes = d.memory_bytes;
    if (d.name == device) {
      target.device_bytes = d.memory_bytes;
      if (d.compute_capability > 0) target.compute_capability = d.compute_capability;
    }
  }
  return target;
}

std::vector<DeviceMemoryStats> GetDeviceMemoryStats() {
  std::vector<DeviceMemoryStats> out;
#if defined(OOMB_HAVE_CUDA)
  const std::vector<std::string>& uuids = CudaUuids();
  namespace alloc = c10::cuda::CUDACachingAllocator;
  // Before the first CUDA allocation the allocator has no per-device state (and getDeviceStats
  // would throw): nothing is allocated or reserved then.
  const bool initialized = !uuids.empty() && alloc::get()->initialized();
  constexpr auto kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  for (size_t i = 0; i < uuids.size(); ++i) {
    DeviceMemoryStats s;
    s.index = static_cast<int>(i);
    s.uuid = uuids[i];
    if (initialized) {
      try {
        const auto stats = alloc::getDeviceStats(static_cast<c10::DeviceIndex>(i));
        s.allocated_bytes = stats.allocated_bytes[kAll].current;
        s.reserved_bytes = stats.reserved_bytes[kAll].current;
        s.peak_allocated_bytes = stats.allocated_bytes[kAll].peak;
        s.alloc_retries = stats.num_alloc_retries;
        s.ooms = stats.num_ooms;
      } catch (const c10::Error&) {
        // The device has no allocator state yet: the zeros above are its truth.
      }
    }
    out.push_back(s);
  }
#endif
  return out;
}

int64_t GetPinnedHostBytes() {
#if defined(OOMB_HAVE_CUDA)
  if (!torch::cuda::is_available()) return 0;
  try {
    return at::getHostAllocator(at::kCUDA)->get_stats().allocated_bytes.current;
  } catch (const c10::Error&) {
    return 0;
  }
#else
  return 0;
#endif
}

}  // namespace oomb
