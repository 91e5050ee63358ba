// The CUDA runtime's handle and error types, for headers that must also compile where the CUDA
// toolkit is absent (kernels/ then builds its CPU path only and every launcher returns
// cudaErrorNotSupported).
#ifndef OOMB_KERNELS_CUDA_TYPES_H_
#define OOMB_KERNELS_CUDA_TYPES_H_

#if defined(OOMB_HAVE_CUDA)
#include <cuda_runtime_api.h>
#else
using cudaStream_t = struct CUstream_st*;
enum cudaError_t { cudaSuccess = 0, cudaErrorNotSupported = 801 };
#endif

#endif  // OOMB_KERNELS_CUDA_TYPES_H_
