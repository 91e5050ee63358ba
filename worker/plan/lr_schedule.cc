#include "worker/plan/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace oomb {

double LearningRate(const JobConfig::Training& t, int64_t step, int64_t total_steps) {
  const double lr = t.learning_rate;
  if (step < t.warmup_steps)
    return lr * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, t.warmup_steps));
  if (t.lr_schedule == LrSchedule::kConstant) return lr;
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - t.warmup_steps));
  const double progress = static_cast<double>(step - t.warmup_steps) / span;
  if (t.lr_schedule == LrSchedule::kLinear) return lr * std::max(0.0, 1.0 - progress);
  return lr * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));  // cosine
}

}  // namespace oomb
