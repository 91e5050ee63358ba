#include "worker/common/status.h"

#include <array>
#include <cstdio>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace oomb {
namespace {

constexpr char kReasonUrl[] = "type.oomb.dev/oomb.Reason";

struct ReasonInfo {
  Reason reason;
  absl::string_view name;
  bool transient;
};

constexpr std::array<ReasonInfo, 14> kReasons = {{
    {Reason::kBadSpec, "BAD_SPEC", false},
    {Reason::kBadData, "BAD_DATA", false},
    {Reason::kBadModel, "BAD_MODEL", false},
    {Reason::kPathDenied, "PATH_DENIED", false},
    {Reason::kCheckpointDirTaken, "CHECKPOINT_DIR_TAKEN", false},
    {Reason::kNanLoss, "NAN_LOSS", false},
    {Reason::kOutOfMemory, "OUT_OF_MEMORY", false},
    {Reason::kDoesNotFit, "DOES_NOT_FIT", false},
    {Reason::kDiskFull, "DISK_FULL", false},
    {Reason::kMaxRuntime, "MAX_RUNTIME", false},
    {Reason::kCudaError, "CUDA_ERROR", true},
    {Reason::kTorchError, "TORCH_ERROR", true},
    {Reason::kPeerFailed, "PEER_FAILED", true},
    {Reason::kInternal, "INTERNAL", true},
}};

const ReasonInfo& Info(Reason r) {
  for (const ReasonInfo& i : kReasons) {
    if (i.reason == r) return i;
  }
  return kReasons.back();
}

// The length of the valid UTF-8 sequence at `s[i]`, or 0 when it is not one.
size_t Utf8Length(absl::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  uint32_t cp = 0;
  if ((c & 0xe0) == 0xc0) {
    n = 2;
    cp = c & 0x1f;
  } else if ((c & 0xf0) == 0xe0) {
    n = 3;
    cp = c & 0x0f;
  } else if ((c & 0xf8) == 0xf0) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3f);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

std::string Hex(unsigned char c) {
  char buf[5];
  std::snprintf(buf, sizeof buf, "\\x%02x", c);
  return buf;
}

// Appends `text`, escaping invalid UTF-8 (and control characters when `escape_controls`), up to
// `max_bytes` of output; returns how many input bytes were taken.
size_t AppendPrintable(absl::string_view text, size_t max_bytes, bool escape_controls, std::string* out) {
  size_t i = 0;
  while (i < text.size()) {
    std::string piece;
    const size_t n = Utf8Length(text, i);
    const auto c = static_cast<unsigned char>(text[i]);
    if (n == 0) {
      piece = Hex(c);
    } else if (escape_controls && n == 1 && (c < 0x20 || c == 0x7f)) {
      piece = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : Hex(c);
    } else {
      piece = std::string(text.substr(i, n));
    }
    if (out->size() + piece.size() > max_bytes) break;
    out->append(piece);
    i += n == 0 ? 1 : n;
  }
  return i;
}

std::string Cut(absl::string_view text, size_t max_bytes, bool escape_controls) {
  std::string out;
  const size_t taken = AppendPrintable(text, max_bytes, escape_controls, &out);
  if (taken == text.size()) return out;
  // Room for the marker: take again with less.
  const std::string marker_max = absl::StrCat("... (", text.size(), " more bytes)");
  out.clear();
  const size_t budget = max_bytes > marker_max.size() ? max_bytes - marker_max.size() : 0;
  const size_t kept = AppendPrintable(text, budget, escape_controls, &out);
  absl::StrAppend(&out, "... (", text.size() - kept, " more bytes)");
  return out;
}

absl::Status WithMessage(const absl::Status& s, std::string message) {
  absl::Status out(s.code(), message);
  s.ForEachPayload([&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

}  // namespace

absl::string_view ReasonName(Reason reason) { return Info(reason).name; }

std::optional<Reason> ParseReason(absl::string_view name) {
  for (const ReasonInfo& i : kReasons) {
    if (i.name == name) return i.reason;
  }
  return std::nullopt;
}

bool IsTransient(Reason reason) { return Info(reason).transient; }

absl::Status WithReason(absl::Status status, Reason reason) {
  if (status.ok()) return status;
  status.SetPayload(kReasonUrl, absl::Cord(ReasonName(reason)));
  return status;
}

std::optional<Reason> ReasonOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kReasonUrl);
  if (!payload.has_value()) return std::nullopt;
  return ParseReason(std::string(*payload));
}

Reason ReasonOrDefault(const absl::Status& status) {
  if (const std::optional<Reason> r = ReasonOf(status)) return *r;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
      return Reason::kBadSpec;
    case absl::StatusCode::kPermissionDenied:
      return Reason::kPathDenied;
    case absl::StatusCode::kResourceExhausted:
      return Reason::kOutOfMemory;
    case absl::StatusCode::kDeadlineExceeded:
      return Reason::kMaxRuntime;
    default:
      return Reason::kInternal;
  }
}

bool IsRetryable(const absl::Status& status) {
  if (status.ok()) return false;
  if (const std::optional<Reason> r = ReasonOf(status)) return IsTransient(*r);
  switch (status.code()) {
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kDeadlineExceeded:
      return true;
    default:
      return false;
  }
}

absl::Status Annotate(const absl::Status& s, absl::string_view context) {
  if (s.ok()) return s;
  return WithMessage(s, absl::StrCat(context, ": ", s.message()));
}

std::string Excerpt(absl::string_view text, size_t max_bytes) { return Cut(text, max_bytes, true); }

std::string BoundedText(absl::string_view text, size_t max_bytes) { return Cut(text, max_bytes, false); }

absl::Status Bounded(const absl::Status& s, size_t max_bytes) {
  if (s.ok()) return s;
  std::string cut = BoundedText(s.message(), max_bytes);
  if (cut == s.message()) return s;
  return WithMessage(s, std::move(cut));
}

}  // namespace oomb
