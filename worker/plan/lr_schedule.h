// Learning-rate schedules, as transformers' get_{constant,linear,cosine}_schedule_with_warmup
// compute them (so a job's curve matches what users know from HF Trainer):
//   warmup:   lr * s / warmup_steps for s < warmup_steps (s = optimizer steps done, from 0)
//   constant: lr
//   linear:   lr * max(0, (total - s) / (total - warmup))
//   cosine:   lr * max(0, 0.5 * (1 + cos(pi * (s - warmup) / (total - warmup))))
// Torch-free.
#ifndef OOMB_WORKER_PLAN_LR_SCHEDULE_H_
#define OOMB_WORKER_PLAN_LR_SCHEDULE_H_

#include <cstdint>

#include "worker/plan/job_config.h"

namespace oomb {

// The learning rate of optimizer step `step` (0-based) of `total_steps`.
double LearningRate(const JobConfig::Training& training, int64_t step, int64_t total_steps);

}  // namespace oomb

#endif  // OOMB_WORKER_PLAN_LR_SCHEDULE_H_
