#include "worker/data/sequence.h"

#include <algorithm>

namespace oomb {

int64_t TokenSequence::label_tokens() const {
  return std::count_if(labels.begin(), labels.end(), [](int64_t l) { return l != kIgnoreLabel; });
}

void TokenSequence::Append(const Document& doc) {
  const int64_t start = size();
  const size_t n = doc.ids.size();
  for (size_t i = 0; i < n; ++i) {
    ids.push_back(doc.ids[i]);
    labels.push_back(i + 1 < n ? doc.labels[i + 1] : kIgnoreLabel);
    positions.push_back(static_cast<int64_t>(i));
    doc_start.push_back(start);
  }
}

TokenSequence TokenSequence::FromDocument(const std::vector<int64_t>& ids) { return Pack({ids}); }

TokenSequence TokenSequence::Pack(const std::vector<std::vector<int64_t>>& docs) {
  TokenSequence s;
  for (const auto& ids : docs) s.Append(Document{ids, ids, 0});
  return s;
}

}  // namespace oomb
