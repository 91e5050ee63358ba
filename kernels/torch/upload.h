// Moving small host-made tensors (page tables, positions, labels, document starts) to the
// device without waiting for it.
//
// A copy from pageable host memory to a GPU waits for everything queued on the stream first
// (LibTorch synchronizes a blocking copy), which drains the device's queue: the device then
// idles while the host builds the work that follows. A copy from pinned memory is queued like a
// kernel; the caching host allocator keeps the pinned buffer until the copy is done.
#ifndef OOMB_KERNELS_TORCH_UPLOAD_H_
#define OOMB_KERNELS_TORCH_UPLOAD_H_

#include <ATen/ATen.h>

namespace oomb::kernels {

// `x` on `device`: itself when already there; from the CPU to a GPU through pinned memory,
// queued on the current stream without waiting.
inline at::Tensor Upload(const at::Tensor& x, const at::Device& device) {
  if (x.device() == device) return x;
  if (x.is_cpu() && device.is_cuda()) return x.pin_memory().to(device, /*non_blocking=*/true);
  return x.to(device);
}

}  // namespace oomb::kernels

#endif  // OOMB_KERNELS_TORCH_UPLOAD_H_
