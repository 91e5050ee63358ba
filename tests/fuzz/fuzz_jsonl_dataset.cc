// libFuzzer target: the JSONL dataset reader (worker/data/dataset.h) on arbitrary bytes, with
// a byte-level tokenizer and a ChatML template so every sample format is reachable, then
// packing of what it read. Contract checked: no crash, leak or UB; a result is either an error
// status or documents whose ids and labels are aligned and in range.
#include <cstdint>
#include <cstdlib>

#include "tests/fuzz/fuzz_input.h"
#include "tests/worker/data/test_tokenizer.h"
#include "worker/data/dataset.h"

namespace {

const oomb::Tokenizer& Tok() {
  static const oomb::Tokenizer* tok = oomb::testing::MakeByteTokenizer(/*newline_merge=*/true).release();
  return *tok;
}

const oomb::ChatTemplate& Chat() {
  static const oomb::ChatTemplate chat =
      *oomb::ChatTemplate::FromJinja("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n'}}{% endfor %}");
  return chat;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (Tok().vocab_size() <= 0) std::abort();
  const oomb::File file = oomb::fuzz::MemFile(data, size);
  oomb::DatasetOptions options;
  // The first byte picks data.too_long and max_seq_len, so every branch is reached.
  const uint8_t knob = size > 0 ? data[0] : 0;
  options.too_long = knob % 3 == 0   ? oomb::TooLong::kTruncate
                     : knob % 3 == 1 ? oomb::TooLong::kDrop
                                     : oomb::TooLong::kError;
  options.max_seq_len = 1 + knob % 64;
  options.vocab_size = (knob & 0x40) ? 0 : 300;
  const oomb::TokenizerLoader loader = [&]() -> absl::StatusOr<oomb::TextTokenizer> {
    if (knob & 0x80) return absl::NotFoundError("no tokenizer");
    return oomb::TextTokenizer{&Tok(), &Chat(), {}};
  };
  oomb::DatasetStats stats;
  auto docs = oomb::ReadJsonlDataset(file, loader, options, &stats);
  if (!docs.ok()) return 0;
  const int64_t vocab = options.vocab_size > 0 ? options.vocab_size : Tok().vocab_size();
  int64_t tokens = 0;
  for (const oomb::Document& d : *docs) {
    if (d.ids.empty() || d.ids.size() != d.labels.size()) std::abort();
    if (static_cast<int64_t>(d.ids.size()) > options.max_seq_len) std::abort();
    for (size_t i = 0; i < d.ids.size(); ++i) {
      if (d.ids[i] < 0 || d.ids[i] >= vocab) std::abort();
      if (d.labels[i] != oomb::kIgnoreLabel && (d.labels[i] < 0 || d.labels[i] >= vocab)) std::abort();
    }
    tokens += static_cast<int64_t>(d.ids.size());
  }
  if (tokens != stats.tokens || static_cast<int64_t>(docs->size()) != stats.samples) std::abort();
  const auto seqs = oomb::PackDocuments(*docs, options.max_seq_len, /*packing=*/true, knob);
  int64_t packed = 0;
  for (const oomb::TokenSequence& s : seqs) {
    if (s.size() > options.max_seq_len) std::abort();
    packed += s.size();
  }
  if (packed != tokens) std::abort();
  return 0;
}
