// Model FLOPs and device peaks for model FLOPs utilisation (MFU), as oomb reports it in step
// progress and /metrics. Torch-free.
//
// MFU = model FLOPs of a step / the step's seconds / the device's peak, with
//   model FLOPs of a sequence of T tokens = 6 N T + 12 d P
// (N parameters of the base model, d = heads * head_dim, P the query-key pairs attended summed
// over the layers: T^2 / 2 for a layer attending the whole past, W T - W^2 / 2 for a sliding
// window of W < T; 6 N T + 6 d L T^2 without windows): the forward and backward matmuls of every
// weight and of causal attention, counted once; the chunk-recurrent
// trainer's recomputation and LoRA's extra matmuls are not model FLOPs. The same formula as
// bench/bench_train.cc, whose MFU divides by a matmul rate measured on the machine instead of
// the datasheet peak used here, and so reads higher.
#ifndef OOMB_WORKER_METRICS_FLOPS_H_
#define OOMB_WORKER_METRICS_FLOPS_H_

#include <cstdint>
#include <string_view>
#include <vector>

namespace oomb {

// 6 N T + 12 d P for one sequence of `tokens` tokens; `layer_windows` holds each layer's
// sliding window, 0 for a layer attending the whole past (ModelSpec::Windows, worker/hf/layer_spec.h).
double SequenceTrainingFlops(int64_t parameters, int64_t attention_dim, const std::vector<int64_t>& layer_windows,
                             int64_t tokens);

// The dense (no sparsity) BF16 tensor-core peak of a CUDA device from its vendor datasheet, by
// the name CUDA reports ("NVIDIA H100 80GB HBM3": 989.4e12); 0 for a device not in the table
// (and for the CPU), for which no MFU is reported.
double PeakDenseBf16Flops(std::string_view device_name);

}  // namespace oomb

#endif  // OOMB_WORKER_METRICS_FLOPS_H_
