// RULER's synthetic tasks: contract in worker/job/ruler.h.
#include "worker/job/ruler.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numbers>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/common/status.h"
#include "worker/hf/chat_template.h"

namespace oomb {
namespace {

using Ids = std::vector<int64_t>;

constexpr char kNoise[] = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
constexpr char kChatMarker[] = "\x01RULER\x01";

absl::StatusOr<Ids> Encode(const Tokenizer& tok, std::string_view text) {
  OOMB_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.EncodeChecked(text));
  return Ids(ids.begin(), ids.end());
}

void Put(const Ids& ids, Ids* out) { out->insert(out->end(), ids.begin(), ids.end()); }

// Pieces tokenized once per RulerDocs call: the noise line, list numbers, words.
class Pieces {
 public:
  explicit Pieces(const Tokenizer& tok) : tok_(tok) {}
  const Tokenizer& tokenizer() const { return tok_; }
  absl::StatusOr<const Ids*> Get(const std::string& text) {
    auto it = cache_.find(text);
    if (it == cache_.end()) {
      OOMB_ASSIGN_OR_RETURN(Ids ids, Encode(tok_, text));
      it = cache_.emplace(text, std::move(ids)).first;
    }
    return &it->second;
  }
  absl::Status Append(const std::string& text, Ids* out) {
    OOMB_ASSIGN_OR_RETURN(const Ids* ids, Get(text));
    Put(*ids, out);
    return absl::OkStatus();
  }

 private:
  const Tokenizer& tok_;
  std::map<std::string, Ids> cache_;
};

// The haystack text, whitespace collapsed as RULER does, cut into sentences.
struct Essay {
  std::string text;
  std::vector<std::pair<size_t, size_t>> sentences;  // [begin, end) of text
  std::vector<std::string> words;                    // cwe's further words, filled on first use

  std::string Sentence(size_t i) const {
    const auto& [b, e] = sentences[i % sentences.size()];
    return text.substr(b, e - b);
  }
};

Essay ReadEssay(const std::string& haystack) {
  Essay e;
  for (const char c : haystack) {
    const bool space = absl::ascii_isspace(static_cast<unsigned char>(c));
    if (!space) {
      e.text += c;
    } else if (!e.text.empty() && e.text.back() != ' ') {
      e.text += ' ';
    }
  }
  size_t begin = 0;
  for (size_t i = 0; i + 1 < e.text.size(); ++i) {
    if ((e.text[i] == '.' || e.text[i] == '!' || e.text[i] == '?') && e.text[i + 1] == ' ') {
      e.sentences.emplace_back(begin, i + 1);
      begin = i + 2;
    }
  }
  if (begin < e.text.size() && e.text.find_first_not_of(' ', begin) != std::string::npos) {
    e.sentences.emplace_back(begin, e.text.size() - (e.text.back() == ' ' ? 1 : 0));
  }
  return e;
}

// The essay's distinct lower-case words of three letters or more that the built-in list lacks.
void CollectWords(Essay& e) {
  if (!e.words.empty()) return;
  std::set<std::string> words;
  const std::vector<std::string>& known = RulerCommonWords();
  std::string w;
  for (size_t i = 0; i <= e.text.size(); ++i) {
    const char c = i < e.text.size() ? e.text[i] : ' ';
    if (absl::ascii_isalpha(static_cast<unsigned char>(c))) {
      w += absl::ascii_tolower(static_cast<unsigned char>(c));
      continue;
    }
    if (w.size() >= 3 && !std::binary_search(known.begin(), known.end(), w)) words.insert(w);
    w.clear();
  }
  e.words.assign(words.begin(), words.end());
}

// Seeded choices, the same on every standard library (no std::shuffle or distributions).
class Random {
 public:
  explicit Random(std::seed_seq& seq) : rng_(seq) {}
  uint64_t Next() { return rng_(); }
  int64_t Below(int64_t n) { return n <= 0 ? 0 : static_cast<int64_t>(rng_() % static_cast<uint64_t>(n)); }
  template <typename T>
  void Shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[Below(static_cast<int64_t>(i))]);
  }
  // `k` distinct values of [0, n), in the order drawn.
  std::vector<int64_t> Sample(int64_t n, int64_t k) {
    std::vector<int64_t> all(n);
    for (int64_t i = 0; i < n; ++i) all[i] = i;
    for (int64_t i = 0; i < k && i < n; ++i) std::swap(all[i], all[i + Below(n - i)]);
    all.resize(std::min(k, n));
    return all;
  }
  std::string Number() { return std::to_string(1000000 + Below(9000000)); }  // 7 digits
  std::string Word() {
    return RulerAdjectives()[Below(RulerAdjectives().size())] + "-" + RulerNouns()[Below(RulerNouns().size())];
  }
  std::string Uuid() {  // version 4, as Python's uuid.UUID(int=..., version=4)
    const uint64_t hi = (Next() & ~uint64_t{0xF000}) | 0x4000;
    const uint64_t lo = (Next() & ~(uint64_t{3} << 62)) | (uint64_t{2} << 62);
    char s[40];
    std::snprintf(s, sizeof(s), "%08llx-%04llx-%04llx-%04llx-%012llx", static_cast<unsigned long long>(hi >> 32),
                  static_cast<unsigned long long>((hi >> 16) & 0xFFFF), static_cast<unsigned long long>(hi & 0xFFFF),
                  static_cast<unsigned long long>(lo >> 48), static_cast<unsigned long long>(lo & 0xFFFFFFFFFFFFull));
    return s;
  }
  std::string Letters(int n, char first) {
    std::string s;
    for (int i = 0; i < n; ++i) s += static_cast<char>(first + Below(26));
    return s;
  }

 private:
  std::mt19937_64 rng_;
};

// One document in the making: what the task's generator reads.
struct Maker {
  Pieces& pieces;
  const PromptFormat& format;
  Random& rng;
  RulerTask task;
  int64_t length;
  int64_t budget;  // prompt tokens: length less the tokens to generate
};

absl::Status TooShort(const Maker& m, int64_t fixed) {
  return absl::InvalidArgumentError(absl::StrCat(
      m.length, " tokens cannot hold ", RulerTaskName(m.task), "'s prompt and its ", RulerTokensToGenerate(m.task),
      " tokens to generate (", fixed + RulerTokensToGenerate(m.task), " tokens before any haystack)"));
}

// Whole haystack units while they fit `budget` tokens, the remainder taken from the end of the
// next one and put first (the context then starts inside a line or sentence).
absl::StatusOr<std::vector<Ids>> Fill(int64_t budget, const std::function<absl::StatusOr<Ids>(int64_t)>& unit) {
  std::vector<Ids> units;
  int64_t used = 0;
  for (int64_t i = 0; used < budget; ++i) {
    OOMB_ASSIGN_OR_RETURN(Ids u, unit(i));
    if (u.empty()) return absl::InvalidArgumentError("the haystack has a piece of no tokens");
    if (used + static_cast<int64_t>(u.size()) > budget) {
      units.insert(units.begin(), Ids(u.end() - (budget - used), u.end()));
      break;
    }
    used += static_cast<int64_t>(u.size());
    units.push_back(std::move(u));
  }
  return units;
}

// The units with inserts[j] before unit slots[j] (slots ascending, at most units.size()); where
// each insert starts, as a fraction of the context's tokens.
struct Context {
  Ids ids;
  std::vector<double> depths;
};

Context Join(const std::vector<Ids>& units, const std::vector<Ids>& inserts, const std::vector<int64_t>& slots) {
  Context c;
  std::vector<int64_t> starts;
  size_t next = 0;
  for (size_t u = 0; u <= units.size(); ++u) {
    for (; next < inserts.size() && slots[next] <= static_cast<int64_t>(u); ++next) {
      starts.push_back(static_cast<int64_t>(c.ids.size()));
      Put(inserts[next], &c.ids);
    }
    if (u < units.size()) Put(units[u], &c.ids);
  }
  for (const int64_t s : starts) c.depths.push_back(static_cast<double>(s) / static_cast<double>(c.ids.size()));
  return c;
}

// before + context + after, the document of `answers`.
RulerDoc Finish(const Maker& m, const Ids& before, const Context& context, const Ids& after,
                std::vector<std::string> answers) {
  RulerDoc d;
  d.task = m.task;
  d.length = m.length;
  d.max_new_tokens = RulerTokensToGenerate(m.task);
  d.prompt = before;
  Put(context.ids, &d.prompt);
  Put(after, &d.prompt);
  d.answers = std::move(answers);
  d.depths = context.depths;
  return d;
}

int64_t Size(const std::vector<Ids>& pieces) {
  int64_t n = 0;
  for (const Ids& p : pieces) n += static_cast<int64_t>(p.size());
  return n;
}

// ---- niah (niah.py) ----

enum class Haystack { kNoise, kEssay, kNeedle };
enum class Kind { kWords, kNumbers, kUuids };

struct NiahSpec {
  Haystack haystack;
  Kind key, value;
  int keys, values, queries;  // num_needle_k, _v, _q
};

NiahSpec NiahOf(RulerTask t) {
  switch (t) {
    case RulerTask::kNiahSingle1:
      return {Haystack::kNoise, Kind::kWords, Kind::kNumbers, 1, 1, 1};
    case RulerTask::kNiahSingle2:
      return {Haystack::kEssay, Kind::kWords, Kind::kNumbers, 1, 1, 1};
    case RulerTask::kNiahSingle3:
      return {Haystack::kEssay, Kind::kWords, Kind::kUuids, 1, 1, 1};
    case RulerTask::kNiahMultikey1:
      return {Haystack::kEssay, Kind::kWords, Kind::kNumbers, 4, 1, 1};
    case RulerTask::kNiahMultikey2:
      return {Haystack::kNeedle, Kind::kWords, Kind::kNumbers, 1, 1, 1};
    case RulerTask::kNiahMultikey3:
      return {Haystack::kNeedle, Kind::kUuids, Kind::kUuids, 1, 1, 1};
    case RulerTask::kNiahMultivalue:
      return {Haystack::kEssay, Kind::kWords, Kind::kNumbers, 1, 4, 1};
    default:  // kNiahMultiquery
      return {Haystack::kEssay, Kind::kWords, Kind::kNumbers, 4, 1, 4};
  }
}

std::string Draw(Random& rng, Kind kind) {
  return kind == Kind::kWords ? rng.Word() : kind == Kind::kNumbers ? rng.Number() : rng.Uuid();
}

const char* KindName(Kind kind) {
  return kind == Kind::kWords ? "words" : kind == Kind::kNumbers ? "numbers" : "uuids";
}

std::string Needle(Kind value_kind, const std::string& key, const std::string& value) {
  return absl::StrCat("One of the special magic ", KindName(value_kind), " for ", key, " is: ", value, ".");
}

// The question's words: RULER's template, in the singular when one value is asked.
struct NiahText {
  std::string intro, question, prefix;
};

NiahText NiahWords(const NiahSpec& s, const std::string& query) {
  const bool one = s.queries * s.values == 1;
  std::string type = KindName(s.value);
  if (one) type.pop_back();
  NiahText t;
  t.intro = absl::StrCat(one ? "A" : "Some", " special magic ", type, one ? " is" : " are",
                         " hidden within the following text. Make sure to memorize it. I will quiz you about the ",
                         type, " afterwards.\n");
  t.question = absl::StrCat(one ? "What is the" : "What are all the", " special magic ", type, " for ", query,
                            " mentioned in the provided text?");
  t.prefix =
      absl::StrCat(" The special magic ", type, " for ", query, " mentioned in the provided text ", one ? "is" : "are");
  return t;
}

// `inserts` places among `units` lines, ascending: distinct lines drawn at random, as RULER
// draws them (where there are fewer lines than inserts, places drawn with repeats).
std::vector<int64_t> LineSlots(Random& rng, int64_t units, int64_t inserts) {
  std::vector<int64_t> slots;
  if (units >= inserts) {
    slots = rng.Sample(units, inserts);
  } else {
    for (int64_t i = 0; i < inserts; ++i) slots.push_back(rng.Below(units + 1));
  }
  std::sort(slots.begin(), slots.end());
  return slots;
}

// Where the needles go among `units` units: between lines at random (noise, needle), or at
// sampled depths of RULER's 40 between sentences (essay).
std::vector<int64_t> NiahSlots(Random& rng, Haystack haystack, int64_t units, int64_t needles) {
  if (haystack != Haystack::kEssay) return LineSlots(rng, units, needles);
  std::vector<int64_t> slots;
  for (const int64_t i : rng.Sample(40, needles)) {
    const int64_t depth = std::lround(static_cast<double>(i) * 100.0 / 39.0);
    slots.push_back(units * depth / 100);
  }
  std::sort(slots.begin(), slots.end());
  return slots;
}

absl::StatusOr<RulerDoc> NiahDoc(const Maker& m, const Essay& essay) {
  const NiahSpec s = NiahOf(m.task);
  const int keys = std::max(s.keys, s.queries);
  std::vector<std::string> key(keys), needles;
  std::vector<std::vector<std::string>> values(keys);
  for (int i = 0; i < keys; ++i) {
    key[i] = Draw(m.rng, s.key);
    for (int j = 0; j < s.values; ++j) {
      values[i].push_back(Draw(m.rng, s.value));
      needles.push_back(Needle(s.value, key[i], values[i].back()));
    }
  }
  m.rng.Shuffle(needles);
  std::vector<std::string> queries, answers;
  for (const int64_t i : m.rng.Sample(keys, s.queries)) {
    queries.push_back(key[i]);
    answers.insert(answers.end(), values[i].begin(), values[i].end());
  }
  std::string query = queries.back();
  if (queries.size() > 1) {
    query = absl::StrCat(absl::StrJoin(queries.begin(), queries.end() - 1, ", "), ", and ", queries.back());
  }
  const NiahText text = NiahWords(s, query);
  const bool lines = s.haystack != Haystack::kEssay;  // lines end with "\n"; sentences start with " "
  Ids before = m.format.head_ids, after;
  OOMB_RETURN_IF_ERROR(m.pieces.Append(text.intro, &before));
  OOMB_RETURN_IF_ERROR(m.pieces.Append(absl::StrCat(lines ? "" : "\n", text.question, m.format.tail), &after));
  OOMB_RETURN_IF_ERROR(m.pieces.Append(text.prefix, &after));
  std::vector<Ids> inserts;
  for (const std::string& n : needles) {
    OOMB_ASSIGN_OR_RETURN(Ids ids, Encode(m.pieces.tokenizer(), lines ? n + "\n" : " " + n));
    inserts.push_back(std::move(ids));
  }
  const int64_t fixed = static_cast<int64_t>(before.size() + after.size()) + Size(inserts);
  if (fixed > m.budget) return TooShort(m, fixed);
  const int64_t start = essay.sentences.empty() ? 0 : m.rng.Below(static_cast<int64_t>(essay.sentences.size()));
  auto unit = [&](int64_t i) -> absl::StatusOr<Ids> {
    if (s.haystack == Haystack::kNoise) return Encode(m.pieces.tokenizer(), absl::StrCat(kNoise, "\n"));
    if (s.haystack == Haystack::kEssay) {
      return Encode(m.pieces.tokenizer(), absl::StrCat(" ", essay.Sentence(static_cast<size_t>(start + i))));
    }
    std::string k = Draw(m.rng, s.key);
    while (std::find(key.begin(), key.end(), k) != key.end()) k = Draw(m.rng, s.key);
    return Encode(m.pieces.tokenizer(), Needle(s.value, k, Draw(m.rng, s.value)) + "\n");
  };
  OOMB_ASSIGN_OR_RETURN(const std::vector<Ids> units, Fill(m.budget - fixed, unit));
  const std::vector<int64_t> slots =
      NiahSlots(m.rng, s.haystack, static_cast<int64_t>(units.size()), static_cast<int64_t>(inserts.size()));
  return Finish(m, before, Join(units, inserts, slots), after, std::move(answers));
}

// ---- vt (variable_tracking.py) ----

constexpr char kVtIntro[] = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";

// "VAR A = 12345" then "VAR B = VAR A " ..., each a line.
std::vector<std::string> Chain(const std::vector<std::string>& names, const std::string& value) {
  std::vector<std::string> out = {absl::StrCat("VAR ", names[0], " = ", value, "\n")};
  for (size_t j = 1; j < names.size(); ++j)
    out.push_back(absl::StrCat("VAR ", names[j], " = VAR ", names[j - 1], " \n"));
  return out;
}

std::string VtQuestion(const Maker& m, const std::string& value, size_t names) {
  return absl::StrCat("Question: Find all variables that are assigned the value ", value, " in the text above.",
                      m.format.tail, " Answer: According to the chain(s) of variable assignment in the text above, ",
                      names, " variables are assigned the value ", value, ", they are: ");
}

// `count` distinct names of `letters` upper-case letters.
std::vector<std::string> Names(Random& rng, int count, int letters) {
  std::vector<std::string> names;
  while (static_cast<int>(names.size()) < count) {
    std::string n = rng.Letters(letters, 'A');
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(std::move(n));
  }
  return names;
}

// The one-shot example: a chain of 3-letter names in as many noise lines as keep its prompt
// within 500 tokens, then its answer.
absl::StatusOr<Ids> VtExample(const Maker& m) {
  const std::vector<std::string> names = Names(m.rng, 5, 3);
  const std::string value = std::to_string(10000 + m.rng.Below(90000));
  Ids before, after, noise;
  OOMB_RETURN_IF_ERROR(m.pieces.Append(m.format.head + kVtIntro, &before));
  OOMB_RETURN_IF_ERROR(m.pieces.Append(VtQuestion(m, value, names.size()), &after));
  OOMB_RETURN_IF_ERROR(m.pieces.Append(absl::StrCat(kNoise, "\n"), &noise));
  std::vector<Ids> inserts;
  for (const std::string& line : Chain(names, value)) {
    OOMB_ASSIGN_OR_RETURN(Ids ids, Encode(m.pieces.tokenizer(), line));
    inserts.push_back(std::move(ids));
  }
  const int64_t fixed = static_cast<int64_t>(before.size() + after.size()) + Size(inserts);
  const int64_t lines = std::max<int64_t>(0, (500 - fixed) / static_cast<int64_t>(noise.size()));
  const std::vector<Ids> units(lines, noise);
  const std::vector<int64_t> slots = LineSlots(m.rng, lines, static_cast<int64_t>(inserts.size()));
  Ids out = before;
  Put(Join(units, inserts, slots).ids, &out);
  Put(after, &out);
  OOMB_RETURN_IF_ERROR(m.pieces.Append(absl::StrCat(" ", absl::StrJoin(names, " "), "\n"), &out));
  return out;
}

absl::StatusOr<RulerDoc> VtDoc(const Maker& m) {
  OOMB_ASSIGN_OR_RETURN(const Ids example, VtExample(m));
  const std::vector<std::string> names = Names(m.rng, 5, 5);
  const std::string value = std::to_string(10000 + m.rng.Below(90000));
  Ids before = m.format.head_ids, after;
  Put(example, &before);
  OOMB_RETURN_IF_ERROR(m.pieces.Append(kVtIntro, &before));
  OOMB_RETURN_IF_ERROR(m.pieces.Append(VtQuestion(m, value, names.size()), &after));
  std::vector<Ids> inserts;
  for (const std::string& line : Chain(names, value)) {
    OOMB_ASSIGN_OR_RETURN(Ids ids, Encode(m.pieces.tokenizer(), line));
    inserts.push_back(std::move(ids));
  }
  const int64_t fixed = static_cast<int64_t>(before.size() + after.size()) + Size(inserts);
  if (fixed > m.budget) return TooShort(m, fixed);
  OOMB_ASSIGN_OR_RETURN(const Ids* noise, m.pieces.Get(absl::StrCat(kNoise, "\n")));
  OOMB_ASSIGN_OR_RETURN(const std::vector<Ids> units, Fill(m.budget - fixed, [&](int64_t) { return *noise; }));
  const std::vector<int64_t> slots =
      LineSlots(m.rng, static_cast<int64_t>(units.size()), static_cast<int64_t>(inserts.size()));
  return Finish(m, before, Join(units, inserts, slots), after, names);
}

// ---- cwe (common_words_extraction.py) ----

constexpr char kCweIntro[] =
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that "
    "appear most often.\n";
constexpr char kCweQuestion[] = "\nQuestion: What are the 10 most common words in the above list?";
constexpr char kCwePrefix[] = " Answer: The top 10 words that appear most often in the list are:";

// The list's entries, "1. word 2. word ...", as pieces: entry i's number then its word.
absl::Status AppendList(Pieces& pieces, const std::vector<std::string>& words, int64_t first, Ids* out) {
  for (size_t i = 0; i < words.size(); ++i) {
    const int64_t n = first + static_cast<int64_t>(i);
    OOMB_RETURN_IF_ERROR(pieces.Append(absl::StrCat(n == 1 ? "" : " ", n, "."), out));
    OOMB_RETURN_IF_ERROR(pieces.Append(" " + words[i], out));
  }
  return absl::OkStatus();
}

// The first `n` words of `pool`: the first 10 `common` times each, the others `uncommon`, shuffled.
std::vector<std::string> WordList(Random& rng, const std::vector<std::string>& pool, int64_t n, int common,
                                  int uncommon) {
  std::vector<std::string> list;
  for (int64_t i = 0; i < n; ++i) list.insert(list.end(), i < 10 ? common : uncommon, pool[i]);
  rng.Shuffle(list);
  return list;
}

// Tokens of the list of WordList(pool, n, ...), whatever its order.
absl::StatusOr<int64_t> ListTokens(Pieces& pieces, const std::vector<std::string>& pool, int64_t n, int common,
                                   int uncommon) {
  int64_t tokens = 0, entries = 0;
  for (int64_t i = 0; i < n; ++i) {
    OOMB_ASSIGN_OR_RETURN(const Ids* w, pieces.Get(" " + pool[i]));
    const int repeats = i < 10 ? common : uncommon;
    tokens += repeats * static_cast<int64_t>(w->size());
    entries += repeats;
  }
  for (int64_t e = 1; e <= entries; ++e) {
    OOMB_ASSIGN_OR_RETURN(const Ids* num, pieces.Get(absl::StrCat(e == 1 ? "" : " ", e, ".")));
    tokens += static_cast<int64_t>(num->size());
  }
  return tokens;
}

// The most words of `pool` whose list fits `budget` tokens (0 when 11 do not).
absl::StatusOr<int64_t> MostWords(Pieces& pieces, const std::vector<std::string>& pool, int64_t budget, int common,
                                  int uncommon) {
  int64_t lo = 11, hi = static_cast<int64_t>(pool.size()), best = 0;
  while (lo <= hi) {
    const int64_t mid = (lo + hi) / 2;
    OOMB_ASSIGN_OR_RETURN(const int64_t t, ListTokens(pieces, pool, mid, common, uncommon));
    if (t <= budget) {
      best = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return best;
}

// The one-shot example (40 words, 10 and 3 times; below 4K tokens 20 words, 3 and 1) with its
// answer, then a line break.
absl::StatusOr<Ids> CweExample(const Maker& m, const std::vector<std::string>& pool) {
  const bool small = m.length < 4096;
  const std::vector<std::string> list = WordList(m.rng, pool, small ? 20 : 40, small ? 3 : 10, small ? 1 : 3);
  Ids out;
  OOMB_RETURN_IF_ERROR(m.pieces.Append(m.format.head + kCweIntro, &out));
  OOMB_RETURN_IF_ERROR(AppendList(m.pieces, list, 1, &out));
  OOMB_RETURN_IF_ERROR(m.pieces.Append(absl::StrCat(kCweQuestion, m.format.tail, kCwePrefix, " "), &out));
  OOMB_RETURN_IF_ERROR(AppendList(m.pieces, std::vector<std::string>(pool.begin(), pool.begin() + 10), 1, &out));
  OOMB_RETURN_IF_ERROR(m.pieces.Append("\n", &out));
  return out;
}

absl::StatusOr<RulerDoc> CweDoc(const Maker& m, Essay& essay) {
  const bool small = m.length < 4096;
  const int common = small ? 6 : 30, uncommon = small ? 1 : 3;
  std::vector<std::string> pool = RulerCommonWords();
  m.rng.Shuffle(pool);
  OOMB_ASSIGN_OR_RETURN(const Ids example, CweExample(m, pool));
  m.rng.Shuffle(pool);
  Ids before = m.format.head_ids, after;
  Put(example, &before);
  OOMB_RETURN_IF_ERROR(m.pieces.Append(kCweIntro, &before));
  OOMB_RETURN_IF_ERROR(m.pieces.Append(absl::StrCat(kCweQuestion, m.format.tail, kCwePrefix), &after));
  const int64_t budget = m.budget - static_cast<int64_t>(before.size() + after.size());
  OOMB_ASSIGN_OR_RETURN(int64_t n, MostWords(m.pieces, pool, budget, common, uncommon));
  if (n == 0) return TooShort(m, m.budget - budget + 11);
  if (n == static_cast<int64_t>(pool.size())) {  // more words than the built-in lists hold: the haystack's
    CollectWords(essay);
    if (essay.words.size() <= pool.size()) {
      return absl::InvalidArgumentError(absl::StrCat("cwe at ", m.length, " tokens needs more than the ", pool.size(),
                                                     " built-in words: give a haystack with more distinct words"));
    }
    pool = essay.words;
    m.rng.Shuffle(pool);
    OOMB_ASSIGN_OR_RETURN(n, MostWords(m.pieces, pool, budget, common, uncommon));
  }
  std::vector<std::string> list = WordList(m.rng, pool, n, common, uncommon);
  Ids context;
  OOMB_RETURN_IF_ERROR(AppendList(m.pieces, list, 1, &context));
  // The remainder: entries of uncommon words, each at most once more, the last one cut.
  for (int64_t i = 0; static_cast<int64_t>(context.size()) < budget; ++i) {
    const std::string& word = pool[10 + i % (n - 10)];
    OOMB_RETURN_IF_ERROR(AppendList(m.pieces, {word}, static_cast<int64_t>(list.size()) + 1 + i, &context));
  }
  context.resize(budget);
  return Finish(m, before, Context{context, {}}, after, std::vector<std::string>(pool.begin(), pool.begin() + 10));
}

// ---- fwe (freq_words_extraction.py) ----

constexpr char kFweIntro[] =
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words.";
constexpr char kFweQuestion[] =
    "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most frequently "
    "appeared words in the above coded text?";
constexpr char kFwePrefix[] =
    " Answer: According to the coded text above, the three most frequently appeared words are:";

// Word k (from 1) appears floor(n k^-2 / zeta(2)) times (Zipf, alpha 2).
int64_t ZipfCount(int64_t n, int64_t k) {
  constexpr double kZeta2 = std::numbers::pi * std::numbers::pi / 6;
  return static_cast<int64_t>(static_cast<double>(n) / (static_cast<double>(k) * static_cast<double>(k)) / kZeta2);
}

absl::StatusOr<int64_t> ZipfTokens(Pieces& pieces, const std::vector<std::string>& vocab, int64_t n) {
  int64_t tokens = 0;
  for (size_t k = 0; k < vocab.size(); ++k) {
    const int64_t count = ZipfCount(n, static_cast<int64_t>(k) + 1);
    if (count == 0) break;
    OOMB_ASSIGN_OR_RETURN(const Ids* w, pieces.Get(" " + vocab[k]));
    tokens += count * static_cast<int64_t>(w->size());
  }
  return tokens;
}

absl::StatusOr<RulerDoc> FweDoc(const Maker& m) {
  const int64_t size = m.budget / 50;  // RULER's vocab_size: (length - tokens to generate) // 50
  if (size < 5) return TooShort(m, 5 * 50);
  std::set<std::string> drawn;
  while (static_cast<int64_t>(drawn.size()) < size) drawn.insert(m.rng.Letters(6, 'a'));
  std::vector<std::string> vocab(drawn.begin(), drawn.end());
  m.rng.Shuffle(vocab);
  vocab[0] = "...";  // the most frequent: noise
  Ids before = m.format.head_ids, after;
  OOMB_RETURN_IF_ERROR(m.pieces.Append(kFweIntro, &before));
  OOMB_RETURN_IF_ERROR(m.pieces.Append(absl::StrCat(kFweQuestion, m.format.tail, kFwePrefix), &after));
  const int64_t budget = m.budget - static_cast<int64_t>(before.size() + after.size());
  if (budget < 1) return TooShort(m, m.budget - budget + 1);
  int64_t lo = 1, hi = budget + size + 1, n = 0;
  while (lo <= hi) {
    const int64_t mid = (lo + hi) / 2;
    OOMB_ASSIGN_OR_RETURN(const int64_t t, ZipfTokens(m.pieces, vocab, mid));
    if (t <= budget) {
      n = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  std::vector<std::string> words;
  for (size_t k = 0; k < vocab.size(); ++k) {
    words.insert(words.end(), ZipfCount(n, static_cast<int64_t>(k) + 1), vocab[k]);
  }
  m.rng.Shuffle(words);
  Ids context;
  for (const std::string& w : words) OOMB_RETURN_IF_ERROR(m.pieces.Append(" " + w, &context));
  while (static_cast<int64_t>(context.size()) < budget) OOMB_RETURN_IF_ERROR(m.pieces.Append(" ...", &context));
  context.resize(budget);
  return Finish(m, before, Context{context, {}}, after, {vocab[1], vocab[2], vocab[3]});
}

bool NeedsEssay(RulerTask t) {
  return t != RulerTask::kVt && t != RulerTask::kCwe && t != RulerTask::kFwe && NiahOf(t).haystack == Haystack::kEssay;
}

absl::StatusOr<RulerDoc> MakeDoc(const Maker& m, Essay& essay) {
  switch (m.task) {
    case RulerTask::kVt:
      return VtDoc(m);
    case RulerTask::kCwe:
      return CweDoc(m, essay);
    case RulerTask::kFwe:
      return FweDoc(m);
    default:
      return NiahDoc(m, essay);
  }
}

}  // namespace

int64_t RulerTokensToGenerate(RulerTask task) {
  switch (task) {
    case RulerTask::kVt:
      return 30;
    case RulerTask::kCwe:
      return 120;
    case RulerTask::kFwe:
      return 50;
    default:
      return 128;
  }
}

absl::StatusOr<PromptFormat> RulerPromptFormat(const Tokenizer& tok) {
  PromptFormat f;
  if (!tok.chat_template().empty()) {
    ChatSpecialTokens special;
    if (auto bos = tok.bos_id()) special.bos = tok.IdToToken(*bos).value_or("");
    if (auto eos = tok.eos_id()) special.eos = tok.IdToToken(*eos).value_or("");
    absl::StatusOr<ChatTemplate> chat = ChatTemplate::FromJinja(tok.chat_template(), std::move(special));
    absl::StatusOr<RenderedChat> rendered =
        chat.ok() ? chat->Render({{"user", kChatMarker}}, /*add_generation_prompt=*/true) : chat.status();
    const size_t at = rendered.ok() ? rendered->text.find(kChatMarker) : std::string::npos;
    if (at != std::string::npos) {
      f.head = rendered->text.substr(0, at);
      f.tail = rendered->text.substr(at + std::string_view(kChatMarker).size());
      OOMB_ASSIGN_OR_RETURN(f.head_ids, Encode(tok, f.head));
      return f;
    }
  }
  // Base: what the tokenizer's post-processor puts before a text (Llama's <s>), as transformers
  // encodes a prompt.
  OOMB_ASSIGN_OR_RETURN(const std::vector<int32_t> bare, tok.EncodeChecked("a"));
  OOMB_ASSIGN_OR_RETURN(const std::vector<int32_t> full, tok.EncodeChecked("a", /*add_special_tokens=*/true));
  const auto at = std::search(full.begin(), full.end(), bare.begin(), bare.end());
  f.head_ids.assign(full.begin(), at);
  return f;
}

absl::StatusOr<std::vector<RulerDoc>> RulerDocs(const Tokenizer& tok, const PromptFormat& format,
                                                const std::string& haystack, const RulerOptions& o) {
  const std::vector<RulerTask> tasks =
      o.tasks.empty() ? std::vector<RulerTask>(std::begin(kRulerTasks), std::end(kRulerTasks)) : o.tasks;
  Essay essay = ReadEssay(haystack);
  for (const RulerTask t : tasks) {
    if (NeedsEssay(t) && essay.sentences.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("required by ", RulerTaskName(t), " (a UTF-8 text for its essay haystack)"));
    }
  }
  Pieces pieces(tok);
  std::vector<RulerDoc> out;
  for (const RulerTask t : tasks) {
    for (const int64_t length : o.lengths) {
      for (int64_t i = 0; i < o.samples; ++i) {
        std::seed_seq seq{static_cast<uint32_t>(o.seed), static_cast<uint32_t>(o.seed >> 32), static_cast<uint32_t>(t),
                          static_cast<uint32_t>(length), static_cast<uint32_t>(length >> 32), static_cast<uint32_t>(i)};
        Random rng(seq);
        const Maker m{pieces, format, rng, t, length, length - RulerTokensToGenerate(t)};
        OOMB_ASSIGN_OR_RETURN(RulerDoc d, MakeDoc(m, essay));
        out.push_back(std::move(d));
      }
    }
  }
  return out;
}

double StringMatchAll(std::string_view prediction, const std::vector<std::string>& answers) {
  if (answers.empty()) return 0;
  std::string p(prediction);
  for (char& c : p) {
    if (static_cast<unsigned char>(c) < 0x20) c = '\n';
  }
  p = absl::AsciiStrToLower(absl::StripAsciiWhitespace(p));
  int64_t found = 0;
  for (const std::string& a : answers) found += p.find(absl::AsciiStrToLower(a)) != std::string::npos ? 1 : 0;
  return static_cast<double>(found) / static_cast<double>(answers.size());
}

}  // namespace oomb
