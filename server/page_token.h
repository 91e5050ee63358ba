// Page tokens of the List methods (AIP-158): opaque to clients, a store position (lists are
// newest first and stable under concurrent creation: the next page is what lies before it) and a
// fingerprint of the request's filter, so a token cannot be reused with another filter.
//
// Thread-safety: pure functions.
#ifndef OOMB_SERVER_PAGE_TOKEN_H_
#define OOMB_SERVER_PAGE_TOKEN_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace oomb::server {

// A stable fingerprint (FNV-1a) of a request's filter, written as text.
uint64_t FilterHash(absl::string_view filter);

std::string EncodePageToken(int64_t position, uint64_t filter);

// INVALID_ARGUMENT "page_token: ..." for a token not made by EncodePageToken, or made for another
// filter; `method` names the List method in the message.
absl::StatusOr<int64_t> DecodePageToken(const std::string& token, uint64_t filter, absl::string_view method);

}  // namespace oomb::server

#endif  // OOMB_SERVER_PAGE_TOKEN_H_
