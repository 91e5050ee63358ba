// The `tokenize` command of the daemon binary (wired into oombd by its main): encodes text to
// token ids or decodes ids to text with a model directory's tokenizer, for checking datasets
// and debugging prompts.
//
//   encode (default):  reads UTF-8 text from `in` until EOF, writes a JSON array of ids and a
//                      newline to `out`;
//   decode:            reads a JSON array of integer ids from `in`, writes the text (no newline
//                      added).
//
// Returns the process exit code: 0 on success; 1 after writing one line "tokenize: <problem>"
// to `err` (tokenizer failed to load, input not UTF-8 / not a JSON array of ints, unknown id).
#ifndef OOMB_WORKER_HF_TOKENIZE_TOOL_H_
#define OOMB_WORKER_HF_TOKENIZE_TOOL_H_

#include <iosfwd>
#include <string>

namespace oomb {

int RunTokenizeTool(const std::string& model_dir, bool decode, bool add_special_tokens, std::istream& in,
                    std::ostream& out, std::ostream& err);

}  // namespace oomb

#endif  // OOMB_WORKER_HF_TOKENIZE_TOOL_H_
