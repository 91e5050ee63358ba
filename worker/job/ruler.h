// RULER's synthetic tasks (Hsieh et al., 2024, "RULER: What's the Real Context Size of Your
// Long-Context Language Models?"; github.com/NVIDIA/RULER): their documents, seeded and offline,
// and RULER's scoring of a prediction. Reimplemented from the paper and the definitions in
// RULER/scripts/synthetic.yaml (each task's arguments), RULER/scripts/data/synthetic/niah.py,
// variable_tracking.py, common_words_extraction.py, freq_words_extraction.py and constants.py
// (the templates, answer prefixes and tokens to generate), RULER/scripts/data/template.py (a model
// template wraps the task's text, the answer prefix follows it) and RULER/scripts/eval/synthetic/
// constants.py (string_match_all). The `ruler` suite (worker/job/eval_suites.h) runs them.
//
// The tasks (RulerTask, worker/metrics/eval_report.h), as synthetic.yaml configures them:
//   niah_single_1   haystack noise (RULER's repeated "The grass is green. ..." lines), one
//                   word key, one 7-digit number;
//   niah_single_2   haystack essay, a word key, a number;
//   niah_single_3   haystack essay, a word key, a UUID;
//   niah_multikey_1 haystack essay, 4 word keys (each with a number), one asked;
//   niah_multikey_2 haystack needle (every line a needle of another key), a word key, a number;
//   niah_multikey_3 haystack needle, a UUID key, a UUID;
//   niah_multivalue haystack essay, one word key with 4 numbers, all asked;
//   niah_multiquery haystack essay, 4 word keys, all 4 asked;
//   vt              variable tracking: a chain "VAR A = 12345", "VAR B = VAR A ", ... of 4
//                   hops in noise lines, after a one-shot example; the answer is the 5 names;
//   cwe             common words: a numbered list in which 10 words appear 30 times and the
//                   others 3 (6 and 1 below 4K tokens), after a one-shot example; the 10;
//   fwe             frequent words: coded 6-letter words drawn with Zipf counts (alpha 2), the
//                   most frequent "..." as noise; the next three.
// A needle reads "One of the special magic {numbers|uuids} for {key} is: {value}.", with the
// template's singular forms ("A special magic number ... What is ...") when one value is
// asked, as niah.py does.
//
// Where this differs from RULER, and why:
//   - The essay haystack is the UTF-8 text file given (`haystack`; the texts
//     scripts/fetch_test_data.sh fetches), not Paul Graham's essays, which are not offline.
//     Each document starts at a sentence from a seeded offset (RULER starts every document at
//     the first essay word); sentences end at ". ", "! " or "? " (RULER uses NLTK's punkt).
//   - Word keys (adjective-noun) and cwe's words come from the built-in word lists of
//     ruler_words.cc, not wonderwords'; where cwe needs more words than they hold (longer
//     documents), it takes the haystack's distinct words, as RULER takes english_words.json.
//   - Lengths are exact in tokens, as the other suites' (pieces tokenized one by one and
//     joined): the prompt is `length` - tokens_to_generate tokens, where RULER's search stops
//     at most that. The context is filled with whole haystack pieces and the remainder with the
//     start of the next one; cwe's remainder takes further list entries of uncommon words
//     (each at most once more: they stay less frequent than the common ones) and fwe's more
//     "..." noise words.
//   - Needles in noise and needle haystacks go between lines at seeded random places, as in
//     RULER; in essays at seeded depths of RULER's 40 (0, 3, 5, ..., 100 percent), between
//     sentences.
//   - vt's one-shot example holds as many whole noise lines as keep it within 500 tokens (RULER
//     searches the count the same way).
// Randomness: each document has its own generator, seeded by (seed, task, length, index), so
// the same seed gives the same documents whichever other tasks and lengths run.
//
// Torch-free header.
#ifndef OOMB_WORKER_JOB_RULER_H_
#define OOMB_WORKER_JOB_RULER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/hf/tokenizer.h"
#include "worker/metrics/eval_report.h"

namespace oomb {

// RULER's tokens_to_generate (RULER/scripts/data/synthetic/constants.py): niah 128, vt 30, cwe 120,
// fwe 50.
int64_t RulerTokensToGenerate(RulerTask task);

// What wraps a task's text, as RULER's model templates do: the text before it and after it
// (the chat's user turn and the assistant's generation prompt), then RULER's answer prefix.
struct PromptFormat {
  std::string head, tail;
  std::vector<int64_t> head_ids;  // head tokenized, or (base) the tokenizer's leading special tokens
};

// The model's chat template around one user message (worker/hf/chat_template.h) when the
// tokenizer has one the engine renders; else the base format (no template: the task's text
// after the tokenizer's leading special tokens, e.g. Llama's <s>). INVALID_ARGUMENT when the
// template's text cannot be tokenized.
absl::StatusOr<PromptFormat> RulerPromptFormat(const Tokenizer& tokenizer);

struct RulerOptions {
  std::vector<RulerTask> tasks;  // empty: all 11, in kRulerTasks' order
  std::vector<int64_t> lengths = {4096};
  int64_t samples = 1;  // documents per (task, length)
  uint64_t seed = 1;
};

struct RulerDoc {
  RulerTask task = RulerTask::kNiahSingle1;
  int64_t length = 0;                // prompt.size() + max_new_tokens
  std::vector<int64_t> prompt;       // ends with the answer prefix
  int64_t max_new_tokens = 0;        // RulerTokensToGenerate
  std::vector<std::string> answers;  // what string_match_all looks for in the continuation
  // niah: where each needle starts, vt: each link of the chain, as the fraction of the
  // context's tokens before it (0 .. 1); empty for cwe and fwe.
  std::vector<double> depths;
};

// The documents of each task at each length, `samples` each, by task then length then index.
// `haystack`: UTF-8 text for the essay tasks (niah_single_2, _3, niah_multikey_1,
// niah_multivalue, niah_multiquery) and for cwe's words beyond the built-in lists; may be empty
// when no task needs it. INVALID_ARGUMENT naming the task and length when a length cannot hold
// the task's fixed text (callers prefix the lengths' field or flag), or when the haystack is
// missing or too short (callers prefix the haystack's).
absl::StatusOr<std::vector<RulerDoc>> RulerDocs(const Tokenizer& tokenizer, const PromptFormat& format,
                                                const std::string& haystack, const RulerOptions& options);

// RULER's string_match_all for one prediction (RULER/scripts/eval/synthetic/constants.py), after its
// postprocessing (RULER/scripts/eval/evaluate.py: control characters become newlines, the ends are
// stripped): the fraction of `answers` found in `prediction`, case-insensitively (ASCII case),
// 0 .. 1. An empty answer list scores 0.
double StringMatchAll(std::string_view prediction, const std::vector<std::string>& answers);

// The built-in word lists (ruler_words.cc): adjectives and nouns (niah's word keys are
// "adjective-noun"), and cwe's words (nouns, adjectives and verbs), each sorted and unique.
const std::vector<std::string>& RulerAdjectives();
const std::vector<std::string>& RulerNouns();
const std::vector<std::string>& RulerCommonWords();

}  // namespace oomb

#endif  // OOMB_WORKER_JOB_RULER_H_
