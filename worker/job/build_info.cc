#include "worker/job/build_info.h"

#include <unistd.h>

#include <torch/cuda.h>
#include <torch/version.h>

#if defined(OOMB_HAVE_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace oomb {

BuildInfo GetBuildInfo() {
  BuildInfo info;
  info.version = "0.1.0";
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
    info.devices.push_back(d);
  }
#endif
  return info;
}

}  // namespace oomb
