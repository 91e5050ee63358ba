#include "server/spec_convert.h"

namespace oomb::server {
namespace {

// Copies a proto field into `out` when it is set (non-empty string, present optional).
void Take(const std::string& in, std::string* out) {
  if (!in.empty()) *out = in;
}

}  // namespace

absl::StatusOr<JobSpec> JobSpecFromProto(const v1::JobSpec& p) {
  JobSpec s;
  s.display_name = p.display_name();
  s.labels = {p.labels().begin(), p.labels().end()};

  Take(p.model().path(), &s.model.path);
  Take(p.model().dtype(), &s.model.dtype);
  if (p.model().has_rope_scaling()) {
    const v1::RopeScaling& r = p.model().rope_scaling();
    RopeScalingSpec rs;
    rs.type = r.type();
    if (r.factor() != 0) rs.factor = r.factor();
    rs.original_max_position_embeddings = r.original_max_position_embeddings();
    rs.low_freq_factor = r.low_freq_factor();
    rs.high_freq_factor = r.high_freq_factor();
    rs.beta_fast = r.beta_fast();
    rs.beta_slow = r.beta_slow();
    s.model.rope_scaling = rs;
  }

  Take(p.method().type(), &s.method.type);
  const v1::LoraSpec& l = p.method().lora();
  if (l.has_rank()) s.method.lora.rank = l.rank();
  if (l.has_alpha()) s.method.lora.alpha = l.alpha();
  if (l.has_dropout()) s.method.lora.dropout = l.dropout();
  if (l.target_modules_size() > 0)
    s.method.lora.target_modules = {l.target_modules().begin(), l.target_modules().end()};

  const v1::DataSpec& d = p.data();
  Take(d.train(), &s.data.train);
  Take(d.validation(), &s.data.validation);
  if (d.has_max_seq_len()) s.data.max_seq_len = d.max_seq_len();
  if (d.has_packing()) s.data.packing = d.packing();
  Take(d.too_long(), &s.data.too_long);
  if (d.has_shuffle_seed()) s.data.shuffle_seed = d.shuffle_seed();

  const v1::TrainingSpec& t = p.training();
  if (t.has_max_steps()) s.training.max_steps = t.max_steps();
  if (t.has_epochs()) {
    s.training.epochs = t.epochs();
    if (!t.has_max_steps() && t.epochs() > 0) s.training.max_steps = 0;  // epochs replace the default
  }
  if (t.has_batch_sequences()) s.training.batch_sequences = t.batch_sequences();
  if (t.has_learning_rate()) s.training.learning_rate = t.learning_rate();
  Take(t.lr_schedule(), &s.training.lr_schedule);
  if (t.has_warmup_steps()) s.training.warmup_steps = t.warmup_steps();
  if (t.has_weight_decay()) s.training.weight_decay = t.weight_decay();
  if (t.adam().has_beta1()) s.training.adam.beta1 = t.adam().beta1();
  if (t.adam().has_beta2()) s.training.adam.beta2 = t.adam().beta2();
  if (t.adam().has_eps()) s.training.adam.eps = t.adam().eps();
  if (t.has_max_grad_norm()) s.training.max_grad_norm = t.max_grad_norm();
  if (t.has_seed()) s.training.seed = t.seed();
  if (t.has_eval_every_steps()) s.training.eval_every_steps = t.eval_every_steps();

  const v1::MemorySpec& m = p.memory();
  if (m.has_chunk_tokens()) s.memory.chunk_tokens = m.chunk_tokens();
  if (m.has_page_tokens()) s.memory.page_tokens = m.page_tokens();
  Take(m.kv_offload(), &s.memory.kv_offload);
  Take(m.kv_grad_dtype(), &s.memory.kv_grad_dtype);

  Take(p.attention().mode(), &s.attention.mode);
  const v1::SparseAttentionSpec& sp = p.attention().sparse();
  if (sp.has_page_budget()) s.attention.sparse.page_budget = sp.page_budget();
  if (sp.has_sink_pages()) s.attention.sparse.sink_pages = sp.sink_pages();
  if (sp.has_local_pages()) s.attention.sparse.local_pages = sp.local_pages();
  Take(sp.selection(), &s.attention.sparse.selection);

  if (p.backward().has_chunk_fraction()) s.backward.chunk_fraction = p.backward().chunk_fraction();

  const v1::CheckpointSpec& c = p.checkpoint();
  if (c.has_every_steps()) s.checkpoint.every_steps = c.every_steps();
  if (c.has_keep_last()) s.checkpoint.keep_last = c.keep_last();
  Take(c.dir(), &s.checkpoint.dir);

  const v1::ResourcesSpec& r = p.resources();
  Take(r.device(), &s.resources.device);
  if (r.has_gpus()) s.resources.gpus = r.gpus();
  if (r.has_priority()) s.resources.priority = r.priority();
  if (r.has_max_retries()) s.resources.max_retries = r.max_retries();
  if (r.has_max_runtime_seconds()) s.resources.max_runtime_seconds = r.max_runtime_seconds();

  absl::Status st = ValidateJobSpec(s);
  if (!st.ok()) return st;
  return s;
}

v1::JobSpec JobSpecToProto(const JobSpec& s) {
  v1::JobSpec p;
  p.set_display_name(s.display_name);
  p.mutable_labels()->insert(s.labels.begin(), s.labels.end());

  p.mutable_model()->set_path(s.model.path);
  p.mutable_model()->set_dtype(s.model.dtype);
  if (s.model.rope_scaling.has_value()) {
    v1::RopeScaling* r = p.mutable_model()->mutable_rope_scaling();
    r->set_type(s.model.rope_scaling->type);
    r->set_factor(s.model.rope_scaling->factor);
    r->set_original_max_position_embeddings(s.model.rope_scaling->original_max_position_embeddings);
    r->set_low_freq_factor(s.model.rope_scaling->low_freq_factor);
    r->set_high_freq_factor(s.model.rope_scaling->high_freq_factor);
    r->set_beta_fast(s.model.rope_scaling->beta_fast);
    r->set_beta_slow(s.model.rope_scaling->beta_slow);
  }

  p.mutable_method()->set_type(s.method.type);
  v1::LoraSpec* l = p.mutable_method()->mutable_lora();
  l->set_rank(s.method.lora.rank);
  l->set_alpha(s.method.lora.alpha);
  l->set_dropout(s.method.lora.dropout);
  for (const std::string& m : s.method.lora.target_modules) l->add_target_modules(m);

  v1::DataSpec* d = p.mutable_data();
  d->set_train(s.data.train);
  d->set_validation(s.data.validation);
  d->set_max_seq_len(s.data.max_seq_len);
  d->set_packing(s.data.packing);
  d->set_too_long(s.data.too_long);
  d->set_shuffle_seed(s.data.shuffle_seed);

  v1::TrainingSpec* t = p.mutable_training();
  t->set_max_steps(s.training.max_steps);
  t->set_epochs(s.training.epochs);
  t->set_batch_sequences(s.training.batch_sequences);
  t->set_learning_rate(s.training.learning_rate);
  t->set_lr_schedule(s.training.lr_schedule);
  t->set_warmup_steps(s.training.warmup_steps);
  t->set_weight_decay(s.training.weight_decay);
  t->mutable_adam()->set_beta1(s.training.adam.beta1);
  t->mutable_adam()->set_beta2(s.training.adam.beta2);
  t->mutable_adam()->set_eps(s.training.adam.eps);
  t->set_max_grad_norm(s.training.max_grad_norm);
  t->set_seed(s.training.seed);
  t->set_eval_every_steps(s.training.eval_every_steps);

  v1::MemorySpec* m = p.mutable_memory();
  m->set_chunk_tokens(s.memory.chunk_tokens);
  m->set_page_tokens(s.memory.page_tokens);
  m->set_kv_offload(s.memory.kv_offload);
  m->set_kv_grad_dtype(s.memory.kv_grad_dtype);

  p.mutable_attention()->set_mode(s.attention.mode);
  v1::SparseAttentionSpec* sp = p.mutable_attention()->mutable_sparse();
  sp->set_page_budget(s.attention.sparse.page_budget);
  sp->set_sink_pages(s.attention.sparse.sink_pages);
  sp->set_local_pages(s.attention.sparse.local_pages);
  sp->set_selection(s.attention.sparse.selection);

  p.mutable_backward()->set_chunk_fraction(s.backward.chunk_fraction);

  v1::CheckpointSpec* c = p.mutable_checkpoint();
  c->set_every_steps(s.checkpoint.every_steps);
  c->set_keep_last(s.checkpoint.keep_last);
  c->set_dir(s.checkpoint.dir);

  v1::ResourcesSpec* r = p.mutable_resources();
  r->set_device(s.resources.device);
  r->set_gpus(s.resources.gpus);
  r->set_priority(s.resources.priority);
  r->set_max_retries(s.resources.max_retries);
  r->set_max_runtime_seconds(s.resources.max_runtime_seconds);
  return p;
}

v1::DatasetSummary DatasetSummaryToProto(const DataSummary& summary) {
  v1::DatasetSummary out;
  out.set_samples(summary.train.samples);
  out.set_sequences(summary.sequences);
  out.set_tokens(summary.train.tokens);
  out.set_dropped(summary.train.dropped);
  out.set_truncated(summary.train.truncated);
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
  return out;
}

}  // namespace oomb::server
