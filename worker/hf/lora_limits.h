// The bounds of a LoRA adapter's rank and alpha, wherever the adapter comes from: the job spec's
// method.lora, whose rules set them (proto/oomb/v1/job_spec.proto, LoraSpec.rank and .alpha:
// `max`), or an adapter_config.json (PEFT's `r` and `lora_alpha`), checked before anything is
// allocated. The proto is where they are set; these are its numbers for the code that cannot
// read the proto's descriptors (the torch side of worker/ sees no generated .pb.h), and
// JobSpecTest.LoraBoundsAreTheEnginesBoundsForAdapterFiles holds them equal to its rules.
// worker/model/transformer_lora.cc checks adapters against them.
// Torch-free, and it includes nothing: any floor of worker/ may read it.
#ifndef OOMB_WORKER_HF_LORA_LIMITS_H_
#define OOMB_WORKER_HF_LORA_LIMITS_H_

#include <cstdint>

namespace oomb {

inline constexpr int64_t kMaxLoraRank = 4096;  // LoraSpec.rank's (rules).max
inline constexpr double kMaxLoraAlpha = 1e6;   // LoraSpec.alpha's (rules).max

}  // namespace oomb

#endif  // OOMB_WORKER_HF_LORA_LIMITS_H_
