#include "server/path_policy.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace oomb::server {
namespace fs = std::filesystem;

namespace {

// Whether canonical `path` is `root` or below it (component-wise: /data2 is not under /data).
bool Under(const fs::path& path, const fs::path& root) {
  auto p = path.begin();
  for (auto r = root.begin(); r != root.end(); ++r, ++p) {
    if (r->empty()) continue;  // a trailing separator
    if (p == path.end() || *p != *r) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<PathPolicy> PathPolicy::Create(const std::string& roots, const std::string& data_dir) {
  PathPolicy policy;
  std::vector<std::string> all = absl::StrSplit(roots, ',', absl::SkipWhitespace());
  all.push_back(data_dir);
  for (const std::string& raw : all) {
    const std::string r(absl::StripAsciiWhitespace(raw));
    std::error_code ec;
    const fs::path canonical = fs::canonical(r, ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat("paths.allowed_roots: ", r, ": ", ec.message()));
    policy.roots_.push_back(canonical.string());
  }
  return policy;
}

absl::Status PathPolicy::Check(const JobSpec& spec) const {
  const std::pair<const char*, const std::string*> fields[] = {{"model.path", &spec.model.path},
                                                               {"data.train", &spec.data.train},
                                                               {"data.validation", &spec.data.validation},
                                                               {"checkpoint.dir", &spec.checkpoint.dir}};
  for (const auto& [field, value] : fields) {
    if (value->empty()) continue;
    if (!fs::path(*value).is_absolute()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": must be an absolute path, got '", *value,
                                                     "' (the oomb CLI makes relative paths absolute)"));
    }
    std::error_code ec;
    const fs::path resolved = fs::weakly_canonical(*value, ec);
    bool allowed = false;
    for (const std::string& root : roots_) allowed = allowed || (!ec && Under(resolved, root));
    if (!allowed) {
      return absl::PermissionDeniedError(absl::StrCat(field, ": ", *value,
                                                      " is outside the directories this server may use "
                                                      "(paths.allowed_roots: ",
                                                      absl::StrJoin(roots_, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace oomb::server
