#include "server/page_token.h"

#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace oomb::server {

uint64_t FilterHash(absl::string_view filter) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : filter) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string EncodePageToken(int64_t position, uint64_t filter) {
  return absl::WebSafeBase64Escape(absl::StrCat("v1:", position, ":", filter));
}

absl::StatusOr<int64_t> DecodePageToken(const std::string& token, uint64_t filter, absl::string_view method) {
  std::string raw;
  std::vector<std::string> parts;
  if (absl::WebSafeBase64Unescape(token, &raw)) parts = absl::StrSplit(raw, ':');
  int64_t position = 0;
  uint64_t f = 0;
  if (parts.size() != 3 || parts[0] != "v1" || !absl::SimpleAtoi(parts[1], &position) ||
      !absl::SimpleAtoi(parts[2], &f) || position <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("page_token: not a token from a previous ", method, " response"));
  }
  if (f != filter) return absl::InvalidArgumentError("page_token: was issued for a different filter");
  return position;
}

}  // namespace oomb::server
