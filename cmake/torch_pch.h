// Precompiled header for translation units that include LibTorch (compiling these headers
// dominates the build; every torch TU of a target reuses one compiled copy).
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>
