#include "tests/smoke/torch_side.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <sstream>

#include "kernels/torch/page_ops.h"

namespace oomb::smoke {

double TorchMatmulSum() {
  const at::Tensor a = at::arange(6, at::kDouble).view({2, 3});
  return a.matmul(a.t()).sum().item<double>();
}

std::string CpuPageGatherError() {
  at::manual_seed(1);
  const auto arena = at::randn({9, 2, 2, 16, 8});
  const auto slots = at::tensor({7, 2, 5}, at::kInt);
  auto [k, v] = kernels::GatherPages(arena, slots);
  // k[h, page*16 + t, :] == arena[slots[page], 0, h, t, :]
  if (!at::equal(k.view({2, 3, 16, 8}).select(1, 1), arena[2][0])) return "k of page 1 differs";
  if (!at::equal(v.view({2, 3, 16, 8}).select(1, 2), arena[5][1])) return "v of page 2 differs";
  return "";
}

bool CudaAvailable() { return torch::cuda::is_available(); }

std::string CudaPageGatherError() {
  at::manual_seed(2);
  const auto arena = at::randn({64, 2, 4, 128, 128}).to(at::kBFloat16);
  const auto slots = at::randperm(64, at::kInt).slice(0, 0, 40);
  const auto garena = arena.to(at::kCUDA);
  auto [gk, gv] = kernels::GatherPages(garena, slots.to(at::kCUDA));
  auto [rk, rv] = kernels::GatherPages(arena, slots);
  if (!at::equal(gk.cpu(), rk) || !at::equal(gv.cpu(), rv)) return "CUDA page gather differs from the CPU reference";
  // One LibTorch CUDA op (a cuBLAS matmul) against the CPU.
  const auto a = at::randn({256, 256}, at::kDouble);
  const double err = (a.to(at::kCUDA).matmul(a.to(at::kCUDA)).cpu() - a.matmul(a)).abs().max().item<double>();
  if (err > 1e-9) {
    std::ostringstream os;
    os << "CUDA matmul differs from the CPU by " << err;
    return os.str();
  }
  return "";
}

}  // namespace oomb::smoke
