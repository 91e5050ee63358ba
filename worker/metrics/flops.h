// Model FLOPs utilisation (MFU): the one definition oomb reports, in step progress (the API's
// Progress.mfu, `oomb get`), metrics.jsonl, /metrics (oomb_job_mfu_ratio), MLflow, bench_train
// and the docs. Torch-free.
//
//   MFU = model FLOPs of a step / the step's seconds / (devices x the device's datasheet dense
//         bf16 peak)
//
// Model FLOPs are counted block by block from the layer description (ModelSpec::TrainingFlops,
// worker/hf/layer_spec.h): 6 N T + 12 d P (N active parameters, T tokens, d = q_dim, P the
// causal query-key pairs summed over the layers). With LoRA this is the convention peers report
// (Megatron, torchtitan, TRL, Unsloth): the frozen base counted as if it were trained.
// FrozenBaseFlops gives the count without the frozen weights' gradients (4 N T + 12 d P), which
// bench_train prints beside it as "mfu_4n". A bf16 matmul rate measured on the machine is
// printed by bench_train as "matmul_bf16_tflops", labelled as a measurement, never divided by.
#ifndef OOMB_WORKER_METRICS_FLOPS_H_
#define OOMB_WORKER_METRICS_FLOPS_H_

#include <cstdint>
#include <string_view>

namespace oomb {

// The dense (no sparsity) BF16 tensor-core peak of a CUDA device from its vendor datasheet, by
// the name CUDA reports ("NVIDIA H100 80GB HBM3": 989.4e12); 0 for a device not in the table
// (and for the CPU), for which no MFU is reported.
double PeakDenseBf16Flops(std::string_view device_name);

// `model_flops` done in `seconds` on `devices` devices of datasheet peak `peak_flops` each, as a
// fraction; 0 where the peak is unknown (0), the time is not positive or there are no devices.
double ModelFlopsUtilization(double model_flops, double seconds, double peak_flops, int64_t devices = 1);

// `model_flops` (6 N T + 12 d P) less the frozen base's weight gradients, 2 N T, for LoRA with
// `active_parameters` N frozen weights a token computes with, over `tokens` T.
double FrozenBaseFlops(double model_flops, double active_parameters, double tokens);

}  // namespace oomb

#endif  // OOMB_WORKER_METRICS_FLOPS_H_
