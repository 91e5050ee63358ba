// The CLI's job-spec reader: a JOBSPEC.md YAML document (plus `--set key=value` overrides) to
// the oomb.v1.JobSpec message. The YAML tree is converted to JSON guided by the message's
// descriptor (so `display_name: 123` is a string and `max_steps: "5"` is rejected by name),
// then parsed with google::protobuf::util::JsonStringToMessage with unknown fields rejected.
// Defaults and range checks are the server's job (one source of truth). Relative paths
// (model.path, data.train, data.validation, checkpoint.dir) are made absolute: those in the
// file against the file's directory, those given with --set against the current directory.
#ifndef OOMB_CLIENT_SPEC_YAML_H_
#define OOMB_CLIENT_SPEC_YAML_H_

#include <string>
#include <vector>

#include "oomb/v1/job_spec.pb.h"

namespace oomb::client {

// On error returns false and sets `error` to a message naming the file, line and field, e.g.
// "job.yaml:3: model.dtpye: unknown field (known: path, dtype, rope_scaling)".
bool LoadJobSpec(const std::string& path, const std::vector<std::string>& overrides, v1::JobSpec* spec,
                 std::string* error);

}  // namespace oomb::client

#endif  // OOMB_CLIENT_SPEC_YAML_H_
