#include "worker/hf/tokenize_tool.h"

#include <istream>
#include <iterator>
#include <ostream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "worker/common/status.h"
#include "worker/hf/tokenizer.h"

namespace oomb {

int RunTokenizeTool(const std::string& model_dir, bool decode, bool add_special_tokens, std::istream& in,
                    std::ostream& out, std::ostream& err) {
  auto fail = [&err](std::string_view msg) {
    err << "tokenize: " << msg << "\n";
    return 1;
  };
  absl::StatusOr<Dir> dir = FileAccess::Unconfined()->OpenDir(model_dir);
  if (!dir.ok()) return fail(Annotate(dir.status(), "reading " + model_dir + "/tokenizer.json").ToString());
  auto tok = Tokenizer::FromModelDir(*dir);
  if (!tok.ok()) return fail(tok.status().ToString());
  const std::string input((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return fail("cannot read standard input");

  if (!decode) {
    auto ids = (*tok)->EncodeChecked(input, add_special_tokens);
    if (!ids.ok()) return fail(absl::StrCat("input ", std::string(ids.status().message())));
    out << nlohmann::json(*ids).dump() << "\n";
    return out.good() ? 0 : fail("cannot write output");
  }
  const nlohmann::json j = nlohmann::json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) return fail("decode input is not a JSON array of token ids");
  std::vector<int32_t> ids;
  ids.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_integer() || j[i].get<int64_t>() < 0 || j[i].get<int64_t>() > INT32_MAX) {
      return fail(absl::StrCat("decode input element ", i, " (", j[i].dump(), ") is not a token id"));
    }
    ids.push_back(static_cast<int32_t>(j[i].get<int64_t>()));
  }
  auto text = (*tok)->Decode(ids, /*skip_special_tokens=*/false);
  if (!text.ok()) return fail(std::string(text.status().message()));
  out << *text;
  return out.good() ? 0 : fail("cannot write output");
}

}  // namespace oomb
