// The job spec at the server: how an oomb.v1.JobSpec (from CreateJob, EstimateJob, the store, or
// a YAML file for `oombd run`) becomes the engine's JobConfig (worker/plan/job_config.h).
//
//   1. the schema's defaults and checks (proto/spec: spec::FillDefaults, spec::CheckRules);
//   2. the checks that relate fields, here:
//        training.batch_sequences >= resources.gpus (each rank trains whole sequences);
//        attention.mode sparse: memory.chunk_tokens a multiple of memory.page_tokens, and
//          attention.sparse.page_budget >= sink_pages + local_pages;
//        model.rope_scaling: factor set; method.lora.init_adapter only with method.type lora;
//   3. the words become enums, the sections the engine's options.
// Errors: INVALID_ARGUMENT naming the dotted field (and "<file>:<line>: " when `source` and
// `lines` say where the document set it), with reason BAD_SPEC.
#ifndef OOMB_SERVER_JOB_SPEC_H_
#define OOMB_SERVER_JOB_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "oomb/v1/job_spec.pb.h"
#include "proto/spec/spec_codec.h"
#include "worker/plan/job_config.h"

namespace oomb::server {

// Fills `spec`'s defaults in place (what is stored and shown to clients is the effective spec),
// checks it, and resolves it.
absl::StatusOr<JobConfig> ResolveJobSpec(v1::JobSpec* spec, const spec::Source& source = {},
                                         const spec::Lines* lines = nullptr);

// The same, of a copy (the spec is left as it is).
absl::StatusOr<JobConfig> ResolveJobSpec(const v1::JobSpec& spec);

// INVALID_ARGUMENT naming display_name when it holds a control character (C0, DEL, C1) or a
// bidirectional formatting character (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to
// U+2069), which would reorder what a terminal or a page shows around it (issue 78). Part of
// ResolveJobSpec; UpdateJob checks a new display_name with it.
absl::Status CheckDisplayName(const std::string& display_name, const spec::Source& source = {},
                              const spec::Lines* lines = nullptr);

// Warnings, naming the field, for what a spec sets (as the client sent it, before defaults)
// that its method ignores: method.lora's rank, alpha, dropout and targets, training and
// checkpoint with method.type evaluate; training.eval_every_steps without data.validation.
std::vector<std::string> IgnoredSettingWarnings(const v1::JobSpec& sent);

// A RoPE scaling written as the spec's model.rope_scaling is (YAML, e.g. "{type: yarn, factor: 8,
// original_max_position_embeddings: 8192}"), with the same checks; errors start with `source`
// (a command's flag).
absl::StatusOr<RopeScalingOverride> ParseRopeScaling(absl::string_view yaml, const std::string& source);

}  // namespace oomb::server

#endif  // OOMB_SERVER_JOB_SPEC_H_
