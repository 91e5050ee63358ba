// Building training samples from long texts (`oombd data build`): plain-text files, or
// directories of them, cut into {"text": ...} JSONL samples of about a target number of tokens
// of the model's tokenizer, for long-context fine-tuning. Torch-free.
//
// Each file is cut on its own (a sample never spans two files), in order. A sample is a run of
// consecutive pieces of the file, cut preferably at paragraph boundaries (a blank line), then,
// only where a sample would otherwise end less than `min_fill` full or a paragraph alone is
// longer than the target, at line ends, then sentence ends (". "), then spaces, and at worst
// between two UTF-8 characters. Separators stay at the end of the piece before the cut, so with
// overlap 0 the samples of a file concatenate to the file, byte for byte: every character lands
// in exactly one sample.
//
// Guarantees: every sample's exact token count (Tokenizer::Encode of the sample's text, no
// special tokens) is <= target_tokens; every sample but the last of a file holds at least
// min_fill * target_tokens tokens, except where piece boundaries make that impossible (a run of
// pieces that cannot be split without exceeding the target: only characters that tokenize to
// many tokens each, in practice never).
//
// With overlap_tokens > 0, each sample after the first of a file starts with the last pieces of
// the previous sample, together at most overlap_tokens tokens (< target_tokens).
#ifndef OOMB_WORKER_DATA_BUILD_H_
#define OOMB_WORKER_DATA_BUILD_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/hf/tokenizer.h"

namespace oomb {

struct BuildOptions {
  int64_t target_tokens = 16384;  // > 0: upper bound of every sample's token count
  int64_t overlap_tokens = 0;     // in [0, target_tokens): context repeated from the previous sample
  int64_t max_samples = 0;        // > 0: stop after this many samples
  double min_fill = 0.9;          // in (0, 1]: below this a paragraph is cut to fill the sample
};

struct BuildStats {
  int64_t files = 0;
  int64_t samples = 0;
  int64_t tokens = 0;  // sum of the samples' token counts
  int64_t bytes = 0;   // bytes of input read
  int64_t min_sample_tokens = 0;
  int64_t max_sample_tokens = 0;
};

// The regular files named by `inputs`: files as given, directories walked recursively with
// their files in path order (hidden files and directories skipped). NOT_FOUND for an input that
// does not exist; INVALID_ARGUMENT when none is a file.
absl::StatusOr<std::vector<std::string>> ListInputFiles(const std::vector<std::string>& inputs);

// The samples of one text, as above. INVALID_ARGUMENT (with the byte offset) for ill-formed
// UTF-8; `emit` receives each sample's text and exact token count, and may stop the cut by
// returning false.
absl::Status CutText(const std::string& text, const Tokenizer& tokenizer, const BuildOptions& options,
                     const std::function<bool(const std::string& sample, int64_t tokens)>& emit);

// Reads every input file, cuts it and writes one {"text": sample} JSON line per sample to
// `out_path` (written to a temporary file, then renamed: never a half-written dataset).
// INVALID_ARGUMENT for bad options or a file that is not UTF-8 (naming it); NOT_FOUND for a
// missing input; INTERNAL when writing fails.
absl::StatusOr<BuildStats> BuildTextDataset(const std::vector<std::string>& inputs, const Tokenizer& tokenizer,
                                            const BuildOptions& options, const std::string& out_path);

}  // namespace oomb

#endif  // OOMB_WORKER_DATA_BUILD_H_
