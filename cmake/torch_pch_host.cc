// The one source of oomb_torch_pch_host (kernels/CMakeLists.txt): the target exists to precompile
// cmake/torch_pch.h once for every executable that includes LibTorch.
