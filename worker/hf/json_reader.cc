#include "worker/hf/json_reader.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace oomb {

using nlohmann::json;

absl::Status JsonReader::Int(const char* key, int64_t* out, bool required) const {
  auto it = j_.find(key);
  if (it == j_.end() || it->is_null()) return required ? Missing(key) : absl::OkStatus();
  if (!it->is_number_integer()) return Bad(key, "an integer", *it);
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Bad(key, "an integer below 2^63", *it);
  }
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status JsonReader::Double(const char* key, double* out, bool required) const {
  auto it = j_.find(key);
  if (it == j_.end() || it->is_null()) return required ? Missing(key) : absl::OkStatus();
  if (!it->is_number()) return Bad(key, "a number", *it);
  *out = it->get<double>();
  return absl::OkStatus();
}

absl::Status JsonReader::Bool(const char* key, bool* out) const {
  auto it = j_.find(key);
  if (it == j_.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return Bad(key, "true or false", *it);
  *out = it->get<bool>();
  return absl::OkStatus();
}

absl::Status JsonReader::String(const char* key, std::string* out) const {
  auto it = j_.find(key);
  if (it == j_.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) return Bad(key, "a string", *it);
  *out = it->get<std::string>();
  return absl::OkStatus();
}

absl::Status JsonReader::TokenId(const char* key, int64_t* out) const {
  auto it = j_.find(key);
  if (it == j_.end() || it->is_null()) return absl::OkStatus();
  if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) {
    *out = (*it)[0].get<int64_t>();
    return absl::OkStatus();
  }
  return Int(key, out, false);
}

absl::Status JsonReader::IntIn(const char* key, int64_t* out, int64_t lo, int64_t hi, bool required) const {
  if (absl::Status s = Int(key, out, required); !s.ok() || !Has(key)) return s;
  if (*out < lo || *out > hi) return OutOfRange(key, absl::StrCat("[", lo, ", ", hi, "]"), absl::StrCat(*out));
  return absl::OkStatus();
}

absl::Status JsonReader::DoubleIn(const char* key, double* out, double lo, double hi, bool lo_open,
                                  bool required) const {
  if (absl::Status s = Double(key, out, required); !s.ok() || !Has(key)) return s;
  const bool below = lo_open ? !(*out > lo) : !(*out >= lo);
  if (below || !(*out <= hi)) {
    return OutOfRange(key, absl::StrCat(lo_open ? "(" : "[", lo, ", ", hi, "]"), absl::StrCat(*out));
  }
  return absl::OkStatus();
}

bool JsonReader::Has(const char* key) const {
  const auto it = j_.find(key);
  return it != j_.end() && !it->is_null();
}

absl::Status JsonReader::OutOfRange(const char* key, const std::string& range, const std::string& got) const {
  return absl::InvalidArgumentError(absl::StrCat(source_, ": key '", key, "' must be in ", range, ", got ", got));
}

absl::Status JsonReader::Missing(const char* key) const {
  return absl::InvalidArgumentError(absl::StrCat(source_, ": missing key '", key, "'"));
}

absl::Status JsonReader::Bad(const char* key, const char* want, const json& got) const {
  std::string shown = got.dump();
  if (shown.size() > 64) shown = shown.substr(0, 64) + "...";
  return absl::InvalidArgumentError(absl::StrCat(source_, ": key '", key, "': expected ", want, ", got ", shown));
}

}  // namespace oomb
