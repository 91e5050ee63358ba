#include "worker/hf/chat_template.h"

#include "absl/strings/str_cat.h"
#include "worker/hf/unicode.h"

namespace oomb {
namespace {

constexpr std::string_view kImStart = "<|im_start|>";
constexpr std::string_view kImEnd = "<|im_end|>";
constexpr std::string_view kHeaderStart = "<|start_header_id|>";
constexpr std::string_view kHeaderEnd = "<|end_header_id|>";
constexpr std::string_view kEot = "<|eot_id|>";

bool Contains(std::string_view s, std::string_view what) { return s.find(what) != std::string_view::npos; }

// The literal default system message of a ChatML template: the first
// '<|im_start|>system\n...<|im_end|>' whose body is plain text (not an expression).
std::optional<std::string> FindDefaultSystem(std::string_view t) {
  const std::string head = absl::StrCat(std::string(kImStart), "system");
  for (size_t at = t.find(head); at != std::string_view::npos; at = t.find(head, at + 1)) {
    size_t body = at + head.size();
    if (t.substr(body, 1) == "\n") {
      body += 1;
    } else if (t.substr(body, 2) == "\\n") {
      body += 2;
    } else {
      continue;
    }
    const size_t end = t.find(kImEnd, body);
    if (end == std::string_view::npos) continue;
    const std::string_view raw = t.substr(body, end - body);
    if (raw.empty() || raw.find_first_of("'\"{}+") != std::string_view::npos) continue;
    std::string text;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '\\' && i + 1 < raw.size() && raw[i + 1] == 'n') {
        text += '\n';
        ++i;
      } else {
        text += raw[i];
      }
    }
    return text;
  }
  return std::nullopt;
}

// Python's str.strip(): Unicode whitespace plus the separators U+001C..U+001F.
std::pair<size_t, size_t> TrimBounds(std::string_view s) {
  const auto is_space = [](char32_t cp) { return IsUnicodeWhitespace(cp) || (cp >= 0x1C && cp <= 0x1F); };
  size_t b = 0;
  while (b < s.size()) {
    size_t p = b;
    if (!is_space(NextCodePoint(s, &p))) break;
    b = p;
  }
  size_t e = s.size();
  while (e > b) {
    size_t q = e - 1;
    while (q > b && (static_cast<unsigned char>(s[q]) & 0xC0) == 0x80) --q;
    size_t p = q;
    if (!is_space(NextCodePoint(s, &p))) break;
    e = q;
  }
  return {b, e};
}

}  // namespace

std::string_view ChatFamilyName(ChatFamily family) {
  switch (family) {
    case ChatFamily::kChatMl:
      return "chatml";
    case ChatFamily::kLlama3:
      return "llama3";
  }
  return "unknown";
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromJinja(std::string_view t, std::string_view bos_token) {
  if (t.empty()) return absl::InvalidArgumentError("the model has no chat template");
  ChatTemplate ct;
  if (Contains(t, kImStart)) {
    if (Contains(t, "<think>")) {
      return absl::UnimplementedError("chat template family 'chatml-reasoning' (Qwen3-style <think>) is not supported");
    }
    ct.family_ = ChatFamily::kChatMl;
    ct.default_system_ = FindDefaultSystem(t);
    return ct;
  }
  if (Contains(t, kHeaderStart)) {
    if (Contains(t, "Cutting Knowledge Date") || Contains(t, "<|python_tag|>")) {
      return absl::UnimplementedError(
          "chat template family 'llama3.1' (date header, tools) is not supported; only Llama-3 is");
    }
    ct.family_ = ChatFamily::kLlama3;
    ct.bos_token_ = bos_token.empty() ? "<|begin_of_text|>" : std::string(bos_token);
    return ct;
  }
  std::string family = "unknown";
  if (Contains(t, "[INST]")) family = "mistral/llama2 ([INST])";
  if (Contains(t, "<start_of_turn>")) family = "gemma";
  if (Contains(t, "<|user|>")) family = "zephyr/phi (<|user|>)";
  return absl::UnimplementedError(absl::StrCat("chat template family '", family, "' is not supported"));
}

absl::StatusOr<RenderedChat> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                  bool add_generation_prompt) const {
  RenderedChat out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("message ", i, ": empty role"));
    }
  }
  std::string& s = out.text;
  if (family_ == ChatFamily::kChatMl) {
    if (default_system_ && !messages.empty() && messages[0].role != "system") {
      absl::StrAppend(&s, std::string(kImStart), "system\n", *default_system_, std::string(kImEnd), "\n");
    }
    for (const ChatMessage& m : messages) {
      absl::StrAppend(&s, std::string(kImStart), m.role, "\n");
      const size_t begin = s.size();
      s += m.content;
      const size_t end = s.size();
      s += kImEnd;
      if (m.role == "assistant") out.assistant_spans.push_back({begin, end, s.size()});
      s += "\n";
    }
    if (add_generation_prompt) absl::StrAppend(&s, std::string(kImStart), "assistant\n");
    return out;
  }
  // Llama-3.
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (i == 0) s += bos_token_;
    absl::StrAppend(&s, std::string(kHeaderStart), m.role, std::string(kHeaderEnd), "\n\n");
    const auto [b, e] = TrimBounds(m.content);
    const size_t begin = s.size();
    s.append(m.content, b, e - b);
    const size_t end = s.size();
    s += kEot;
    if (m.role == "assistant") out.assistant_spans.push_back({begin, end, s.size()});
  }
  if (add_generation_prompt)
    absl::StrAppend(&s, std::string(kHeaderStart), "assistant", std::string(kHeaderEnd), "\n\n");
  return out;
}

}  // namespace oomb
