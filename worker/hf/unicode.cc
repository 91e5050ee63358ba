#include "worker/hf/unicode.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace oomb {
namespace {

struct CombiningClassEntry {
  char32_t cp;
  uint8_t ccc;
};
struct PairEntry {
  char32_t a, b, c;
};

#include "worker/hf/unicode_nfc_tables.inc"

constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr int kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

int CombiningClass(char32_t cp) {
  if (cp < 0x300) return 0;
  auto it = std::lower_bound(std::begin(kCombiningClass), std::end(kCombiningClass), cp,
                             [](const CombiningClassEntry& e, char32_t c) { return e.cp < c; });
  return (it != std::end(kCombiningClass) && it->cp == cp) ? it->ccc : 0;
}

void Decompose(char32_t cp, std::vector<char32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const int s = static_cast<int>(cp - kSBase);
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0) {
    auto it = std::lower_bound(std::begin(kDecomposition), std::end(kDecomposition), cp,
                               [](const PairEntry& e, char32_t c) { return e.a < c; });
    if (it != std::end(kDecomposition) && it->a == cp) {
      Decompose(it->b, out);
      if (it->c != 0) Decompose(it->c, out);
      return;
    }
  }
  out->push_back(cp);
}

// The primary composite of (a, b), or 0.
char32_t Compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  auto it = std::lower_bound(std::begin(kComposition), std::end(kComposition), std::make_pair(a, b),
                             [](const PairEntry& e, const std::pair<char32_t, char32_t>& k) {
                               return e.a != k.first ? e.a < k.first : e.b < k.second;
                             });
  return (it != std::end(kComposition) && it->a == a && it->b == b) ? it->c : 0;
}

// Length of the well-formed sequence starting at s[i], or 0 if ill-formed; for ill-formed
// input `*maximal` receives the length of the maximal subpart (at least 1).
size_t SequenceLength(std::string_view s, size_t i, size_t* maximal) {
  const auto u = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = u(i);
  *maximal = 1;
  if (c < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return 0;
    const unsigned char b = u(i + k);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    *maximal = k + 1;
  }
  return need + 1;
}

}  // namespace

bool IsValidUtf8(std::string_view s, size_t* error_offset) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      std::copy_n(s.data() + i, 8, reinterpret_cast<char*>(&w));
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    size_t maximal;
    const size_t n = SequenceLength(s, i, &maximal);
    if (n == 0) {
      if (error_offset != nullptr) *error_offset = i;
      return false;
    }
    i += n;
  }
  return true;
}

std::string RepairUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t maximal;
    const size_t n = SequenceLength(s, i, &maximal);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      i += maximal;
    } else {
      out.append(s.data() + i, n);
      i += n;
    }
  }
  return out;
}

char32_t NextCodePoint(std::string_view s, size_t* pos) {
  const auto u = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[k])); };
  size_t i = *pos;
  const char32_t c = u(i);
  if (c < 0x80) {
    *pos = i + 1;
    return c;
  }
  if (c < 0xE0) {
    *pos = i + 2;
    return ((c & 0x1F) << 6) | (u(i + 1) & 0x3F);
  }
  if (c < 0xF0) {
    *pos = i + 3;
    return ((c & 0x0F) << 12) | ((u(i + 1) & 0x3F) << 6) | (u(i + 2) & 0x3F);
  }
  *pos = i + 4;
  return ((c & 0x07) << 18) | ((u(i + 1) & 0x3F) << 12) | ((u(i + 2) & 0x3F) << 6) | (u(i + 3) & 0x3F);
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string NfcNormalize(std::string_view s) {
  // Lead bytes below 0xCC encode code points below U+0300, which are all NFC-stable starters
  // that nothing before them can compose with.
  if (std::none_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) >= 0xCC; })) {
    return std::string(s);
  }
  std::vector<char32_t> d;
  d.reserve(s.size());
  for (size_t i = 0; i < s.size();) Decompose(NextCodePoint(s, &i), &d);

  // Canonical ordering: stable-sort each run of non-starters by combining class.
  for (size_t i = 0; i < d.size();) {
    if (CombiningClass(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && CombiningClass(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j,
                     [](char32_t a, char32_t b) { return CombiningClass(a) < CombiningClass(b); });
    i = j;
  }

  // Canonical composition (the UAX #15 sample algorithm).
  std::vector<char32_t> out;
  out.reserve(d.size());
  size_t starter_pos = 0;
  int last_class = -1;  // -1: no starter yet
  for (char32_t cp : d) {
    const int cls = CombiningClass(cp);
    if (last_class != -1 && !out.empty()) {
      const char32_t composite = Compose(out[starter_pos], cp);
      const bool adjacent = starter_pos + 1 == out.size();
      if (composite != 0 && (adjacent || (last_class != 0 && last_class < cls))) {
        out[starter_pos] = composite;
        continue;
      }
    }
    if (cls == 0) {
      starter_pos = out.size();
      last_class = 0;
    } else if (last_class != -1) {
      last_class = cls;
    }
    out.push_back(cp);
  }
  std::string result;
  result.reserve(s.size());
  for (char32_t cp : out) AppendUtf8(cp, &result);
  return result;
}

const char* UnicodeDataVersion() { return OOMB_UNICODE_VERSION; }

bool IsUnicodeWhitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

}  // namespace oomb
