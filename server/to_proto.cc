#include "server/to_proto.h"

namespace oomb::server {

v1::DatasetSummary DatasetSummaryToProto(const DataSummary& summary) {
  v1::DatasetSummary out;
  out.set_samples(summary.train.samples);
  out.set_sequences(summary.sequences);
  out.set_tokens(summary.train.tokens);
  out.set_dropped(summary.train.dropped);
  out.set_truncated(summary.train.truncated);
  out.set_longest_sample(summary.train.longest);
  for (int64_t b : summary.train.length_bounds) out.add_length_bounds(b);
  for (int64_t c : summary.train.length_counts) out.add_length_counts(c);
  return out;
}

v1::EstimateJobResponse MemoryPlanToProto(const MemoryPlan& plan) {
  v1::EstimateJobResponse out;
  out.set_fits(plan.fits);
  out.set_device(plan.device);
  out.set_peak_device_bytes(plan.peak_device_bytes);
  out.set_peak_host_bytes(plan.peak_host_bytes);
  out.set_device_capacity_bytes(plan.device_capacity_bytes);
  out.set_host_capacity_bytes(plan.host_capacity_bytes);
  out.set_weights_bytes(plan.weights_bytes);
  out.set_trainable_state_bytes(plan.trainable_state_bytes);
  out.set_seq_len(plan.seq_len);
  out.set_kv_bytes_per_token(plan.kv_bytes_per_token);
  out.set_activation_bytes(plan.activation_bytes);
  out.set_kv_bytes(plan.kv_bytes);
  out.set_kv_device_bytes(plan.kv_device_bytes);
  out.set_kv_host_bytes(plan.kv_host_bytes);
  out.set_max_seq_len_that_fits(plan.max_seq_len_that_fits);
  out.set_limit(plan.limit);
  out.set_placement(plan.placement);
  out.set_swap_bytes(plan.swap_bytes);
  for (const std::string& c : plan.choices) out.add_choices(c);
  return out;
}

v1::EvaluationResult EvaluationToProto(const EvalReport& report, int64_t step) {
  v1::EvaluationResult out;
  out.set_step(step);
  for (const auto& [suite, result] : report) {
    v1::EvaluationResult::Suite& s = (*out.mutable_suites())[SuiteName(suite)];
    for (const PositionLoss& p : result.buckets) {
      v1::EvaluationResult::Bucket* b = s.add_buckets();
      b->set_begin(p.begin);
      b->set_end(p.end);
      b->set_loss(p.loss);
      b->set_tokens(p.tokens);
    }
    for (const RetrievalScore& c : result.cells) {
      v1::EvaluationResult::Cell* x = s.add_cells();
      x->set_length(c.length);
      x->set_depth(c.depth);
      x->set_correct(c.correct);
      x->set_trials(c.trials);
    }
    if (const std::optional<double> a = result.accuracy()) s.set_accuracy(*a);
    for (const RulerScore& r : result.ruler) {
      v1::EvaluationResult::TaskScore* t = s.add_tasks();
      t->set_task(RulerTaskName(r.task));
      t->set_length(r.length);
      t->set_score(r.score);
      t->set_samples(r.samples);
    }
    for (const auto& [length, score] : result.averages()) {
      v1::EvaluationResult::LengthScore* a = s.add_averages();
      a->set_length(length);
      a->set_score(score);
    }
    if (const std::optional<int64_t> e = result.effective_length()) {
      s.set_threshold(result.threshold);
      s.set_effective_length(*e);
    }
  }
  return out;
}

}  // namespace oomb::server
