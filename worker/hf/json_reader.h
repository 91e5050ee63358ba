// Typed, bounded reads of the keys of one JSON object from a file a client names (config.json,
// base_config.json, adapter_config.json). Every number such a file gives is read with the
// range the engine accepts, before anything is sized by it: a value outside it is
// INVALID_ARGUMENT naming the file and the key ("<source>: key 'r' must be in [1, 4096], got
// 200000"), never an allocation. A value of the wrong JSON type is INVALID_ARGUMENT naming what
// was expected and what came.
//
// Thread-safety: a JsonReader only reads the object it was made on, which must outlive it.
#ifndef OOMB_WORKER_HF_JSON_READER_H_
#define OOMB_WORKER_HF_JSON_READER_H_

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"

namespace oomb {

class JsonReader {
 public:
  // `source` names the file (and the object within it) in messages.
  JsonReader(const nlohmann::json& object, std::string source) : j_(object), source_(std::move(source)) {}

  // An absent or null key leaves `*out` as it is (its default), or is an error when `required`.
  absl::Status Int(const char* key, int64_t* out, bool required = true) const;
  absl::Status Double(const char* key, double* out, bool required = true) const;
  absl::Status Bool(const char* key, bool* out) const;
  absl::Status String(const char* key, std::string* out) const;
  // eos_token_id may be a list (Llama 3.1): the first entry is used.
  absl::Status TokenId(const char* key, int64_t* out) const;

  // As Int and Double, and then a value the object gives must lie in [lo, hi]; for doubles,
  // `lo_open` makes the lower bound exclusive ((0, hi]), and NaN is never in range.
  absl::Status IntIn(const char* key, int64_t* out, int64_t lo, int64_t hi, bool required = false) const;
  absl::Status DoubleIn(const char* key, double* out, double lo, double hi, bool lo_open = false,
                        bool required = false) const;

  // The error IntIn/DoubleIn give, for a value checked elsewhere (one read by hand).
  absl::Status OutOfRange(const char* key, const std::string& range, const std::string& got) const;

  // Whether the object has `key` with a value other than null.
  bool Has(const char* key) const;
  const std::string& source() const { return source_; }

 private:
  absl::Status Missing(const char* key) const;
  absl::Status Bad(const char* key, const char* want, const nlohmann::json& got) const;

  const nlohmann::json& j_;
  std::string source_;
};

}  // namespace oomb

#endif  // OOMB_WORKER_HF_JSON_READER_H_
