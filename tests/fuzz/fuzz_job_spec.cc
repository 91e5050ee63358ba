// libFuzzer target: the job spec's YAML codec (proto/spec/spec_codec.h) and its resolution
// (server/job_spec.h) on arbitrary text, what `oombd run` and the CLI feed them. Contract: no
// crash, leak, UB or hang; every refusal says why; an accepted spec survives ToYaml + ParseYaml
// unchanged and resolves or is refused with a message; a --set style override on it is accepted
// or refused cleanly.
#include <google/protobuf/util/message_differencer.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "proto/spec/spec_codec.h"
#include "server/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  oomb::v1::JobSpec spec;
  const absl::Status parsed = oomb::spec::ParseYaml(text, {"fuzz.yaml", ""}, &spec);
  if (!parsed.ok()) {
    if (parsed.message().empty()) std::abort();  // every refusal says why
    return 0;
  }
  oomb::v1::JobSpec again;
  if (!oomb::spec::ParseYaml(oomb::spec::ToYaml(spec), {"roundtrip.yaml", ""}, &again).ok() ||
      !google::protobuf::util::MessageDifferencer::Equals(again, spec)) {
    std::abort();
  }
  oomb::v1::JobSpec resolved = spec;
  const auto config = oomb::server::ResolveJobSpec(&resolved);
  if (!config.ok() && config.status().message().empty()) std::abort();
  // The first line of the input as an override ("key=value"), as `--set` passes it.
  (void)oomb::spec::ApplyOverride(text.substr(0, text.find('\n')), "", &spec);
  return 0;
}
