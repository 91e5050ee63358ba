// The LibTorch half of the link smoke test, behind a torch-free header (the gRPC half must not
// see torch's bundled protobuf headers; see worker/CMakeLists.txt).
#ifndef OOMB_TESTS_SMOKE_TORCH_SIDE_H_
#define OOMB_TESTS_SMOKE_TORCH_SIDE_H_

#include <string>

namespace oomb::smoke {

// sum([[0,1,2],[3,4,5]] @ its transpose), computed by LibTorch on the CPU: 83.
double TorchMatmulSum();
// Gathers random pages with the CPU reference; returns "" when the result is right.
std::string CpuPageGatherError();
bool CudaAvailable();
// With a GPU: one LibTorch CUDA op and the custom page-gather kernel, compared with the CPU
// reference; returns "" when both are right.
std::string CudaPageGatherError();

}  // namespace oomb::smoke

#endif  // OOMB_TESTS_SMOKE_TORCH_SIDE_H_
