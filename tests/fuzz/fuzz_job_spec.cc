// libFuzzer target: the job spec reader (worker/job/job_spec.h, ParseJobSpecYaml) on arbitrary
// text — what `oombd run` and `oombd serve`'s clients feed it. Contract checked: no crash, leak,
// UB or hang; an accepted spec passes ValidateJobSpec and survives JobSpecToYaml +
// ParseJobSpecYaml unchanged; --set style overrides on it are accepted or refused cleanly.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "worker/job/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto spec = oomb::ParseJobSpecYaml(text, "fuzz.yaml");
  if (!spec.ok()) {
    if (spec.status().message().empty()) std::abort();  // every refusal says why
    return 0;
  }
  if (!oomb::ValidateJobSpec(*spec).ok()) std::abort();
  auto again = oomb::ParseJobSpecYaml(oomb::JobSpecToYaml(*spec), "roundtrip.yaml");
  if (!again.ok() || !(*again == *spec)) std::abort();
  // The first line of the input as an override ("key=value"), as `--set` passes it.
  oomb::JobSpec copy = *spec;
  (void)oomb::ApplyOverride(&copy, text.substr(0, text.find('\n')));
  return 0;
}
