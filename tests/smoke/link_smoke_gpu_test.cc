// The GPU half of the link smoke test: one LibTorch CUDA op (a cuBLAS matmul against the CPU)
// and oomb's page-gather kernel against its CPU reference. Skips without a CUDA device.
#include <gtest/gtest.h>

#include "tests/smoke/torch_side.h"

namespace oomb {
namespace {

TEST(LinkSmokeGpuTest, CudaOpAndCustomKernel) {
  if (!smoke::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  EXPECT_EQ(smoke::CudaPageGatherError(), "");
}

}  // namespace
}  // namespace oomb
