#include "worker/hf/chat_template.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "worker/common/status.h"
#include "worker/hf/unicode.h"

namespace oomb {
namespace {

constexpr absl::string_view kImStart = "<|im_start|>";
constexpr absl::string_view kImEnd = "<|im_end|>";
constexpr absl::string_view kHeaderStart = "<|start_header_id|>";
constexpr absl::string_view kHeaderEnd = "<|end_header_id|>";
constexpr absl::string_view kEot = "<|eot_id|>";
constexpr absl::string_view kStartOfTurn = "<start_of_turn>";
constexpr absl::string_view kEndOfTurn = "<end_of_turn>";
constexpr absl::string_view kThinkOpen = "<think>";
constexpr absl::string_view kThinkClose = "</think>";
constexpr absl::string_view kPhiEnd = "<|end|>";
constexpr absl::string_view kHarmonyStart = "<|start|>";
constexpr absl::string_view kHarmonyMessage = "<|message|>";
constexpr absl::string_view kHarmonyEnd = "<|end|>";
constexpr absl::string_view kHarmonyReturn = "<|return|>";

bool Contains(absl::string_view s, absl::string_view what) { return s.find(what) != absl::string_view::npos; }

// The literal default system message of a ChatML template: the first
// '<|im_start|>system\n...<|im_end|>' whose body is plain text (not an expression).
std::optional<std::string> FindDefaultSystem(absl::string_view t) {
  const std::string head = absl::StrCat(std::string(kImStart), "system");
  for (size_t at = t.find(head); at != absl::string_view::npos; at = t.find(head, at + 1)) {
    size_t body = at + head.size();
    if (t.substr(body, 1) == "\n") {
      body += 1;
    } else if (t.substr(body, 2) == "\\n") {
      body += 2;
    } else {
      continue;
    }
    const size_t end = t.find(kImEnd, body);
    if (end == absl::string_view::npos) continue;
    const absl::string_view raw = t.substr(body, end - body);
    if (raw.empty() || raw.find_first_of("'\"{}+") != absl::string_view::npos) continue;
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
std::pair<size_t, size_t> TrimBounds(absl::string_view text) {
  const std::string_view s(text.data(), text.size());
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

// Python's str.lstrip('\n') / rstrip('\n') / strip('\n').
absl::string_view LStripNewlines(absl::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
absl::string_view RStripNewlines(absl::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

absl::string_view Trimmed(absl::string_view s) {
  const auto [b, e] = TrimBounds(s);
  return s.substr(b, e - b);
}

// Appends an assistant reply `content` and its end marker to `out`, recording the span.
void AppendReply(RenderedChat* out, absl::string_view content, absl::string_view end_marker) {
  const size_t begin = out->text.size();
  out->text.append(content.data(), content.size());
  const size_t end = out->text.size();
  out->text.append(end_marker.data(), end_marker.size());
  out->assistant_spans.push_back({begin, end, out->text.size()});
}

// Jinja's "roles must alternate" check as Gemma's and Mistral's templates write it: the i-th
// message counted is a user message exactly when i is even.
absl::Status CheckAlternation(const std::vector<const ChatMessage*>& counted, size_t first_index) {
  for (size_t i = 0; i < counted.size(); ++i) {
    if ((counted[i]->role == "user") != (i % 2 == 0)) {
      return absl::InvalidArgumentError(absl::StrCat("message ", first_index + i, " ('", counted[i]->role,
                                                     "'): the chat template needs the conversation roles to "
                                                     "alternate user/assistant/user/assistant/..."));
    }
  }
  return absl::OkStatus();
}

RenderedChat RenderChatMl(const std::vector<ChatMessage>& messages, const std::optional<std::string>& default_system,
                          bool add_generation_prompt) {
  RenderedChat out;
  std::string& s = out.text;
  if (default_system && !messages.empty() && messages[0].role != "system") {
    absl::StrAppend(&s, kImStart, "system\n", *default_system, kImEnd, "\n");
  }
  for (const ChatMessage& m : messages) {
    absl::StrAppend(&s, kImStart, m.role, "\n");
    if (m.role == "assistant") {
      AppendReply(&out, m.content, kImEnd);
    } else {
      absl::StrAppend(&s, m.content, kImEnd);
    }
    s += "\n";
  }
  if (add_generation_prompt) absl::StrAppend(&s, kImStart, "assistant\n");
  return out;
}

// The index of the last user message that is not a wrapped tool response (Qwen3's
// last_query_index; the last message's index when there is none).
size_t Qwen3LastQuery(const std::vector<ChatMessage>& messages) {
  for (size_t i = messages.size(); i-- > 0;) {
    const absl::string_view c = messages[i].content;
    if (messages[i].role == "user" &&
        !(absl::StartsWith(c, "<tool_response>") && absl::EndsWith(c, "</tool_response>")))
      return i;
  }
  return messages.empty() ? 0 : messages.size() - 1;
}

RenderedChat RenderQwen3(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  RenderedChat out;
  std::string& s = out.text;
  if (!messages.empty() && messages[0].role == "system")
    absl::StrAppend(&s, kImStart, "system\n", messages[0].content, kImEnd, "\n");
  const size_t last_query = Qwen3LastQuery(messages);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool last = i + 1 == messages.size();
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      absl::StrAppend(&s, kImStart, m.role, "\n", m.content, kImEnd, "\n");
    } else if (m.role == "assistant") {
      absl::string_view answer = m.content;
      absl::string_view reasoning;
      if (const size_t close = answer.find(kThinkClose); close != absl::string_view::npos) {
        reasoning = RStripNewlines(answer.substr(0, close));
        if (const size_t open = reasoning.rfind(kThinkOpen); open != absl::string_view::npos) {
          reasoning.remove_prefix(open + kThinkOpen.size());
        }
        reasoning = LStripNewlines(reasoning);
        answer = LStripNewlines(answer.substr(answer.rfind(kThinkClose) + kThinkClose.size()));
      }
      absl::StrAppend(&s, kImStart, m.role, "\n");
      if (i > last_query && (last || !reasoning.empty())) {
        const std::string written = absl::StrCat(kThinkOpen, "\n", RStripNewlines(LStripNewlines(reasoning)), "\n",
                                                 kThinkClose, "\n\n", LStripNewlines(answer));
        AppendReply(&out, written, kImEnd);
      } else {
        AppendReply(&out, answer, kImEnd);
      }
      s += "\n";
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") absl::StrAppend(&s, kImStart, "user");
      absl::StrAppend(&s, "\n<tool_response>\n", m.content, "\n</tool_response>");
      if (last || messages[i + 1].role != "tool") absl::StrAppend(&s, kImEnd, "\n");
    }
  }
  if (add_generation_prompt) absl::StrAppend(&s, kImStart, "assistant\n");
  return out;
}

// A Llama-3 turn: "<|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>".
void AppendLlamaTurn(RenderedChat* out, const ChatMessage& m) {
  absl::StrAppend(&out->text, kHeaderStart, m.role, kHeaderEnd, "\n\n");
  if (m.role == "assistant") {
    AppendReply(out, Trimmed(m.content), kEot);
  } else {
    absl::StrAppend(&out->text, Trimmed(m.content), kEot);
  }
}

RenderedChat RenderLlama3(const std::vector<ChatMessage>& messages, const std::string& bos,
                          bool add_generation_prompt) {
  RenderedChat out;
  std::string& s = out.text;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0) s += bos;
    AppendLlamaTurn(&out, messages[i]);
  }
  if (add_generation_prompt) absl::StrAppend(&s, kHeaderStart, "assistant", kHeaderEnd, "\n\n");
  return out;
}

// Llama-3.1: the system turn with its date header, then Llama-3's turns; tool results as
// "ipython" turns holding the content as a JSON string.
RenderedChat RenderLlama31(const std::vector<ChatMessage>& messages, const std::string& bos, const std::string& date,
                           bool add_generation_prompt) {
  RenderedChat out;
  std::string& s = out.text;
  const bool has_system = !messages.empty() && messages[0].role == "system";
  absl::StrAppend(&s, bos, kHeaderStart, "system", kHeaderEnd,
                  "\n\nCutting Knowledge Date: December 2023\nToday Date: ", date, "\n\n",
                  has_system ? Trimmed(messages[0].content) : "", kEot);
  for (size_t i = has_system ? 1 : 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool" || m.role == "ipython") {
      const std::string json = nlohmann::json(m.content).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      absl::StrAppend(&s, kHeaderStart, "ipython", kHeaderEnd, "\n\n", json, kEot);
      continue;
    }
    AppendLlamaTurn(&out, m);
  }
  if (add_generation_prompt) absl::StrAppend(&s, kHeaderStart, "assistant", kHeaderEnd, "\n\n");
  return out;
}

absl::StatusOr<RenderedChat> RenderGemma(const std::vector<ChatMessage>& messages, const std::string& bos,
                                         bool add_generation_prompt) {
  const bool has_system = !messages.empty() && messages[0].role == "system";
  const size_t first = has_system ? 1 : 0;
  std::vector<const ChatMessage*> turns;
  for (size_t i = first; i < messages.size(); ++i) turns.push_back(&messages[i]);
  OOMB_RETURN_IF_ERROR(CheckAlternation(turns, first));
  RenderedChat out;
  std::string& s = out.text;
  s += bos;
  for (size_t i = 0; i < turns.size(); ++i) {
    const ChatMessage& m = *turns[i];
    const bool assistant = m.role == "assistant";
    absl::StrAppend(&s, kStartOfTurn, assistant ? "model" : m.role, "\n");
    if (i == 0 && has_system) absl::StrAppend(&s, messages[0].content, "\n\n");
    if (assistant) {
      AppendReply(&out, Trimmed(m.content), kEndOfTurn);
    } else {
      absl::StrAppend(&s, Trimmed(m.content), kEndOfTurn);
    }
    s += "\n";
  }
  if (add_generation_prompt) absl::StrAppend(&s, kStartOfTurn, "model\n");
  return out;
}

// Mistral v0.3 ("[INST] " and " {reply|trim}") or Nemo ("[INST]" and "{reply}", `nemo`).
absl::StatusOr<RenderedChat> RenderMistral(const std::vector<ChatMessage>& messages, const ChatSpecialTokens& tokens,
                                           bool nemo) {
  const bool has_system = !messages.empty() && messages[0].role == "system";
  const size_t first = has_system ? 1 : 0;
  std::vector<const ChatMessage*> turns;
  for (size_t i = first; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (nemo && (role == "tool" || role == "tool_results")) {
      return absl::InvalidArgumentError(absl::StrCat("message ", i, " ('", role,
                                                     "'): the chat template needs the tool call's id "
                                                     "(tool_call_id), which chat messages here do not carry"));
    }
    if (role != "user" && role != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat("message ", i, " ('", role,
                                                     "'): the chat template supports only user and assistant "
                                                     "roles, after an optional first system message"));
    }
    turns.push_back(&messages[i]);
  }
  OOMB_RETURN_IF_ERROR(CheckAlternation(turns, first));
  RenderedChat out;
  std::string& s = out.text;
  s += tokens.bos;
  for (size_t i = 0; i < turns.size(); ++i) {
    const ChatMessage& m = *turns[i];
    if (m.role == "user") {
      s += nemo ? "[INST]" : "[INST] ";
      if (i + 1 == turns.size() && has_system) absl::StrAppend(&s, messages[0].content, "\n\n");
      absl::StrAppend(&s, m.content, "[/INST]");
    } else if (nemo) {
      AppendReply(&out, m.content, tokens.eos);
    } else {
      s += " ";
      AppendReply(&out, Trimmed(m.content), tokens.eos);
    }
  }
  return out;
}

RenderedChat RenderPhi(ChatFamily family, const std::vector<ChatMessage>& messages, bool skip_empty_system,
                       const std::string& eos, bool add_generation_prompt) {
  const char* const newline = family == ChatFamily::kPhi3 ? "\n" : "";
  RenderedChat out;
  std::string& s = out.text;
  for (const ChatMessage& m : messages) {
    if (family == ChatFamily::kPhi3) {
      if (m.role != "system" && m.role != "user" && m.role != "assistant") continue;
      if (m.role == "system" && skip_empty_system && m.content.empty()) continue;
    }
    absl::StrAppend(&s, "<|", m.role, "|>", newline);
    if (m.role == "assistant") {
      AppendReply(&out, m.content, kPhiEnd);
    } else {
      absl::StrAppend(&s, m.content, kPhiEnd);
    }
    s += newline;
  }
  if (add_generation_prompt) {
    absl::StrAppend(&s, "<|assistant|>", newline);
  } else {
    s += eos;
  }
  return out;
}

// The lines of gpt-oss's template whose output RenderHarmony writes; a harmony template without
// one of them (an earlier revision, a fine-tuner's variant) renders otherwise.
constexpr absl::string_view kHarmonyLines[] = {
    R"({%- set model_identity = "You are ChatGPT, a large language model trained by OpenAI." %})",
    R"({{- "Knowledge cutoff: 2024-06\n" }})",
    R"({{- "Current date: " + strftime_now("%Y-%m-%d") + "\n\n" }})",
    R"({%- set reasoning_effort = "medium" %})",
    R"({{- "Reasoning: " + reasoning_effort + "\n\n" }})",
    R"({{- "# Valid channels: analysis, commentary, final. Channel must be included for every message." }})",
    R"({%- if messages[0].role == "developer" or messages[0].role == "system" %})",
    R"({{- "# Instructions\n\n" }})",
    "{{- developer_message }}\n        {{- \"\\n\\n\" }}",
    R"({%- elif loop.last and not add_generation_prompt %})",
    R"({{- "<|start|>assistant<|channel|>final<|message|>" + message.content + "<|return|>" }})",
    R"({{- "<|start|>assistant<|channel|>final<|message|>" + message.content + "<|end|>" }})",
    R"({{- "<|start|>user<|message|>" + message.content + "<|end|>" }})",
    "{%- if add_generation_prompt -%}\n<|start|>assistant\n{%- endif -%}",
};

// What gpt-oss's template refuses among plain messages (its raise_exception calls).
absl::Status CheckHarmony(const std::vector<ChatMessage>& messages) {
  if (messages.empty()) return absl::InvalidArgumentError("the chat template needs at least one message");
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      return absl::InvalidArgumentError(absl::StrCat("message ", i,
                                                     " ('tool'): the chat template needs an earlier assistant "
                                                     "message with a tool call (tool_calls), which chat messages "
                                                     "here do not carry"));
    }
    if (m.role == "assistant" &&
        (Contains(m.content, "<|channel|>analysis<|message|>") || Contains(m.content, "<|channel|>final<|message|>"))) {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i,
                       " ('assistant'): the chat template refuses <|channel|> tags in the content: it takes the "
                       "reasoning in a 'thinking' field, which chat messages here do not carry, and the final answer "
                       "as the content"));
    }
  }
  return absl::OkStatus();
}

// gpt-oss (harmony): the system turn with its date, the developer turn from a leading system or
// developer message, then user turns and assistant replies on the final channel.
absl::StatusOr<RenderedChat> RenderHarmony(const std::vector<ChatMessage>& messages, const std::string& date,
                                           bool add_generation_prompt) {
  OOMB_RETURN_IF_ERROR(CheckHarmony(messages));
  RenderedChat out;
  std::string& s = out.text;
  absl::StrAppend(&s, kHarmonyStart, "system", kHarmonyMessage,
                  "You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n"
                  "Current date: ",
                  date,
                  "\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be "
                  "included for every message.",
                  kHarmonyEnd);
  const bool has_developer = messages[0].role == "system" || messages[0].role == "developer";
  if (has_developer && !messages[0].content.empty()) {
    absl::StrAppend(&s, kHarmonyStart, "developer", kHarmonyMessage, "# Instructions\n\n", messages[0].content, "\n\n",
                    kHarmonyEnd);
  }
  for (size_t i = has_developer ? 1 : 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      absl::StrAppend(&s, kHarmonyStart, "user", kHarmonyMessage, m.content, kHarmonyEnd);
    } else if (m.role == "assistant") {
      absl::StrAppend(&s, kHarmonyStart, "assistant<|channel|>final", kHarmonyMessage);
      const bool ends = i + 1 == messages.size() && !add_generation_prompt;
      AppendReply(&out, m.content, ends ? kHarmonyReturn : kHarmonyEnd);
    }
  }
  if (add_generation_prompt) absl::StrAppend(&s, kHarmonyStart, "assistant");
  return out;
}

}  // namespace

std::string_view ChatFamilyName(ChatFamily family) {
  switch (family) {
    case ChatFamily::kChatMl:
      return "chatml";
    case ChatFamily::kQwen3:
      return "qwen3";
    case ChatFamily::kLlama3:
      return "llama3";
    case ChatFamily::kLlama31:
      return "llama3.1";
    case ChatFamily::kGemma:
      return "gemma";
    case ChatFamily::kGemma2:
      return "gemma2";
    case ChatFamily::kMistral:
      return "mistral";
    case ChatFamily::kMistralNemo:
      return "mistral-nemo";
    case ChatFamily::kPhi3:
      return "phi3";
    case ChatFamily::kPhi4Mini:
      return "phi4-mini";
    case ChatFamily::kHarmony:
      return "gpt-oss";
  }
  return "unknown";
}

namespace {

// The family of a template, or UNIMPLEMENTED naming the family it resembles.
absl::StatusOr<ChatFamily> Recognise(absl::string_view t) {
  if (Contains(t, kHarmonyStart) && Contains(t, "<|channel|>")) {
    for (const absl::string_view line : kHarmonyLines) {
      if (!Contains(t, line)) {
        return absl::UnimplementedError(
            "chat template family 'harmony' other than gpt-oss's (its current revision) is not supported");
      }
    }
    return ChatFamily::kHarmony;
  }
  if (Contains(t, kImStart)) {
    if (!Contains(t, kThinkOpen)) return ChatFamily::kChatMl;
    if (Contains(t, "last_query_index") && Contains(t, "reasoning_content")) return ChatFamily::kQwen3;
    return absl::UnimplementedError(
        "chat template family 'chatml-reasoning' (a <think> template other than Qwen3's) is not supported");
  }
  if (Contains(t, kHeaderStart)) {
    if (Contains(t, "Cutting Knowledge Date") || Contains(t, "<|python_tag|>")) {
      if (Contains(t, R"("Today Date: " + date_string)") && Contains(t, "tools_in_user_message") &&
          !Contains(t, "<|image|>")) {
        return ChatFamily::kLlama31;
      }
      return absl::UnimplementedError(
          "chat template family 'llama3.x' (a date header) other than Llama-3.1's and Llama-3.2's text template "
          "is not supported");
    }
    return ChatFamily::kLlama3;
  }
  if (Contains(t, kStartOfTurn)) {
    if (Contains(t, "first_user_prefix")) return ChatFamily::kGemma;
    if (Contains(t, "System role not supported")) return ChatFamily::kGemma2;
    return absl::UnimplementedError("chat template family 'gemma' other than Gemma 2's and 3's is not supported");
  }
  if (Contains(t, "[INST]")) {
    if (!Contains(t, "[SYSTEM_PROMPT]")) {
      if (Contains(t, R"("[INST] " + system_message + "\n\n")")) return ChatFamily::kMistral;
      if (Contains(t, R"("[INST]" + system_message + "\n\n")")) return ChatFamily::kMistralNemo;
    }
    return absl::UnimplementedError(
        "chat template family 'mistral/llama2 ([INST])' other than Mistral-7B-Instruct-v0.3's and "
        "Mistral-Nemo's is not supported");
  }
  if (Contains(t, R"('<|user|>\n' + message['content'] + '<|end|>\n')")) return ChatFamily::kPhi3;
  if (Contains(t, R"('<|' + message['role'] + '|>' + message['content'] + '<|end|>')")) return ChatFamily::kPhi4Mini;
  if (Contains(t, "<|user|>")) {
    return absl::UnimplementedError(
        "chat template family 'zephyr/phi (<|user|>)' other than Phi-3's and Phi-4-mini's "
        "is not supported");
  }
  return absl::UnimplementedError("chat template family 'unknown' is not supported");
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromJinja(std::string_view text, ChatSpecialTokens tokens) {
  const absl::string_view t(text.data(), text.size());
  if (t.empty()) return absl::InvalidArgumentError("the model has no chat template");
  OOMB_ASSIGN_OR_RETURN(const ChatFamily family, Recognise(t));
  ChatTemplate ct;
  ct.family_ = family;
  if (family == ChatFamily::kChatMl) ct.default_system_ = FindDefaultSystem(t);
  const bool llama = family == ChatFamily::kLlama3 || family == ChatFamily::kLlama31;
  if (llama && tokens.bos.empty()) tokens.bos = "<|begin_of_text|>";
  if (family == ChatFamily::kLlama31) {
    ct.date_ =
        Contains(t, "strftime_now") ? absl::FormatTime("%d %b %Y", absl::Now(), absl::LocalTimeZone()) : "26 Jul 2024";
  }
  if (family == ChatFamily::kHarmony) ct.date_ = absl::FormatTime("%Y-%m-%d", absl::Now(), absl::LocalTimeZone());
  if (family == ChatFamily::kPhi3)
    ct.skip_empty_system_ = Contains(t, "message['role'] == 'system' and message['content']");
  const bool mistral = family == ChatFamily::kMistral || family == ChatFamily::kMistralNemo;
  const bool needs_bos = family == ChatFamily::kGemma || family == ChatFamily::kGemma2 || mistral;
  const bool needs_eos = mistral || family == ChatFamily::kPhi3 || family == ChatFamily::kPhi4Mini;
  if ((needs_bos && tokens.bos.empty()) || (needs_eos && tokens.eos.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the '", std::string(ChatFamilyName(family)), "' chat template needs the model's ",
        needs_bos && tokens.bos.empty() ? "bos_token" : "eos_token", " (tokenizer_config.json) and it has none"));
  }
  ct.tokens_ = std::move(tokens);
  return ct;
}

absl::StatusOr<RenderedChat> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                  bool add_generation_prompt) const {
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("message ", i, ": empty role"));
    }
  }
  switch (family_) {
    case ChatFamily::kChatMl:
      return RenderChatMl(messages, default_system_, add_generation_prompt);
    case ChatFamily::kQwen3:
      return RenderQwen3(messages, add_generation_prompt);
    case ChatFamily::kLlama3:
      return RenderLlama3(messages, tokens_.bos, add_generation_prompt);
    case ChatFamily::kLlama31:
      return RenderLlama31(messages, tokens_.bos, date_, add_generation_prompt);
    case ChatFamily::kGemma:
      return RenderGemma(messages, tokens_.bos, add_generation_prompt);
    case ChatFamily::kGemma2:
      if (!messages.empty() && messages[0].role == "system") {
        return absl::InvalidArgumentError("message 0 ('system'): the chat template does not support a system role");
      }
      return RenderGemma(messages, tokens_.bos, add_generation_prompt);
    case ChatFamily::kMistral:
    case ChatFamily::kMistralNemo:
      return RenderMistral(messages, tokens_, family_ == ChatFamily::kMistralNemo);
    case ChatFamily::kPhi3:
    case ChatFamily::kPhi4Mini:
      return RenderPhi(family_, messages, skip_empty_system_, tokens_.eos, add_generation_prompt);
    case ChatFamily::kHarmony:
      return RenderHarmony(messages, date_, add_generation_prompt);
  }
  return absl::InternalError("unknown chat family");
}

}  // namespace oomb
