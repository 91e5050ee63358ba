// Model FLOPs and device peaks for model FLOPs utilisation (MFU), as oomb reports it in step
// progress and /metrics. Torch-free.
//
// MFU = model FLOPs of a step / the step's seconds / the device's peak, with the model FLOPs of
// a sequence counted block by block from the layer description (ModelSpec::TrainingFlops,
// worker/hf/layer_spec.h: 6 N T + 12 d P). bench/bench_train.cc divides the same FLOPs by a
// matmul rate measured on the machine instead of the datasheet peak used here, and so reads
// higher.
#ifndef OOMB_WORKER_METRICS_FLOPS_H_
#define OOMB_WORKER_METRICS_FLOPS_H_

#include <cstdint>
#include <string_view>

namespace oomb {

// The dense (no sparsity) BF16 tensor-core peak of a CUDA device from its vendor datasheet, by
// the name CUDA reports ("NVIDIA H100 80GB HBM3": 989.4e12); 0 for a device not in the table
// (and for the CPU), for which no MFU is reported.
double PeakDenseBf16Flops(std::string_view device_name);

}  // namespace oomb

#endif  // OOMB_WORKER_METRICS_FLOPS_H_
