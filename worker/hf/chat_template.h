// Chat formatting for supervised fine-tuning: renders a conversation the way the model's own
// Jinja chat template (tokenizer_config.json "chat_template") does, and reports where each
// assistant reply sits in the text so training can restrict the loss to assistant turns.
//
// oomb does not run Jinja. It recognises the template families it trains and renders them
// natively; the tests check the output, and which conversations a template refuses, against
// transformers' apply_chat_template:
//   kChatMl   (Qwen2, Qwen2.5, SmolLM2): "<|im_start|>{role}\n{content}<|im_end|>\n" per
//             message, preceded by the template's default system message (when it has one)
//             if the first message is not a system message.
//   kQwen3    (Qwen3, ChatML with <think>): as ChatML without a default system message; an
//             assistant reply after the last user message is written
//             "<think>\n{reasoning}\n</think>\n\n{answer}" (empty reasoning when the reply has
//             no "</think>"); earlier replies keep only their answer (the text after the last
//             "</think>"). "tool" messages become <tool_response> blocks of a user turn; other
//             roles are left out, as the template leaves them out.
//   kLlama3   (Llama-3 / 3-Instruct): "{bos}" once, then per message
//             "<|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>".
//   kLlama31  (Llama-3.1, and Llama-3.2's text template): "{bos}", then a system turn
//             "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December
//             2023\nToday Date: {date}\n\n{system|trim}<|eot_id|>" (system: the first message
//             when it is one, else empty), then each other message as Llama-3 writes it, except
//             "tool" and "ipython" messages: an "ipython" turn holding the content as a JSON
//             string (the template's tojson). {date} is "26 Jul 2024", or, where the template
//             asks for strftime_now (Llama-3.2), the day the template was loaded, "%d %b %Y" in
//             local time, as transformers renders it.
//   kGemma    (Gemma 3): "{bos}", then "<start_of_turn>{role}\n{content|trim}
//             <end_of_turn>\n" with "assistant" written "model"; a leading system message is
//             put before the first turn's content followed by "\n\n". Turns must alternate
//             user / assistant, starting with user.
//   kGemma2   (Gemma 2): as kGemma without a system message: a leading system message is
//             refused, and so are roles that do not alternate user / other, starting with user.
//   kMistral  (Mistral-7B-Instruct-v0.3): "{bos}", then
//             "[INST] {content}[/INST]" per user message and " {content|trim}{eos}" per
//             assistant message; a leading system message is put before the LAST user
//             message only when that message ends the conversation ("{system}\n\n{content}").
//             User / assistant must alternate, starting with user; other roles are refused.
//   kMistralNemo (Mistral-Nemo-Instruct-2407): as kMistral without spaces:
//             "[INST]{content}[/INST]" per user message and "{content}{eos}" per assistant
//             message (not trimmed), the system message likewise before the last user message
//             only when that message ends the conversation. Tool messages are refused: the
//             template needs a tool_call_id, which ChatMessage does not carry.
//   kPhi3     (Phi-3, Phi-3.5): "<|{role}|>\n{content}<|end|>\n" for system, user and
//             assistant (other roles left out; Phi-3.5 also leaves out an empty system
//             message), then "{eos}" unless a generation prompt "<|assistant|>\n" is asked for.
//   kPhi4Mini (Phi-4-mini): "<|{role}|>{content}<|end|>" for every role, then "{eos}" unless a
//             generation prompt "<|assistant|>" is asked for.
//   kHarmony  (gpt-oss-20b and -120b, OpenAI's "harmony" format; the template's current revision,
//             the one in tests/worker/hf/testdata): a system turn "<|start|>system<|message|>You
//             are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n
//             Current date: {date}\n\nReasoning: medium\n\n# Valid channels: analysis,
//             commentary, final. Channel must be included for every message.<|end|>" ({date}: the
//             day the template was loaded, "%Y-%m-%d" in local time, as transformers renders the
//             template's strftime_now); a first message that is a system or developer message
//             becomes "<|start|>developer<|message|># Instructions\n\n{content}\n\n<|end|>"
//             (nothing when its content is empty); then "<|start|>user<|message|>{content}<|end|>"
//             per user message and "<|start|>assistant<|channel|>final<|message|>{content}<|end|>"
//             per assistant message, ended "<|return|>" instead when it is the last message and no
//             generation prompt ("<|start|>assistant") is asked for; other roles are left out, as
//             the template leaves them out. Refused as the template refuses them: an empty
//             conversation, "tool" messages (they need an earlier assistant message's tool_calls,
//             which ChatMessage does not carry) and assistant content holding
//             "<|channel|>analysis<|message|>" or "<|channel|>final<|message|>" (the template takes
//             the reasoning in a "thinking" field, which ChatMessage does not carry either).
// Where the template refuses a conversation (raise_exception), Render is INVALID_ARGUMENT
// with the template's reason. Other templates (date-header templates other than those above,
// Llama-3.2 Vision's, older [INST] templates, Mistral's [SYSTEM_PROMPT] templates, harmony
// templates other than gpt-oss's current one, ...) are UNIMPLEMENTED, with the family named in
// the message.
//
// Immutable after construction; thread-safe.
#ifndef OOMB_WORKER_HF_CHAT_TEMPLATE_H_
#define OOMB_WORKER_HF_CHAT_TEMPLATE_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace oomb {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", or any other role the template passes through
  std::string content;
};

// Byte offsets into RenderedChat::text of one assistant message.
struct AssistantSpan {
  size_t content_begin = 0;  // first byte of what the model writes: the content as rendered
                             // (trimmed for Llama-3, Gemma and Mistral v0.3; with its <think> block
                             // for a Qwen3 reply after the last user message)
  size_t content_end = 0;    // one past its last byte
  size_t turn_end = 0;       // one past the end-of-turn marker (<|im_end|>, <|eot_id|>,
                             // <end_of_turn>, </s>, <|end|>, gpt-oss's <|return|>), for callers
                             // that also train the model to stop
};

struct RenderedChat {
  std::string text;
  std::vector<AssistantSpan> assistant_spans;  // in message order
};

enum class ChatFamily {
  kChatMl,
  kQwen3,
  kLlama3,
  kLlama31,
  kGemma,
  kGemma2,
  kMistral,
  kMistralNemo,
  kPhi3,
  kPhi4Mini,
  kHarmony
};

// "chatml", "qwen3", "llama3", "llama3.1", "gemma", "gemma2", "mistral", "mistral-nemo", "phi3",
// "phi4-mini" or "gpt-oss".
std::string_view ChatFamilyName(ChatFamily family);

// What the template's `bos_token` and `eos_token` variables hold (tokenizer_config.json).
struct ChatSpecialTokens {
  std::string bos;  // Llama-3: "<|begin_of_text|>" when empty; Gemma, Mistral need it set
  std::string eos;  // Mistral, Phi need it set
};

class ChatTemplate {
 public:
  // Recognises the family of the Jinja `template_text`.
  // INVALID_ARGUMENT when `template_text` is empty (the model has no chat template) or when the
  // family needs a special token `tokens` lacks (naming it); UNIMPLEMENTED naming the family
  // for templates outside the list above.
  static absl::StatusOr<ChatTemplate> FromJinja(std::string_view template_text, ChatSpecialTokens tokens = {});

  ChatFamily family() const { return family_; }

  // The system message the template inserts when the conversation has none (ChatML only).
  const std::optional<std::string>& default_system() const { return default_system_; }

  // Renders `messages`; with `add_generation_prompt`, appends the header of an assistant turn.
  // INVALID_ARGUMENT naming the message index when a role is empty or when the template would
  // refuse the conversation.
  absl::StatusOr<RenderedChat> Render(const std::vector<ChatMessage>& messages,
                                      bool add_generation_prompt = false) const;

 private:
  ChatTemplate() = default;

  ChatFamily family_ = ChatFamily::kChatMl;
  std::optional<std::string> default_system_;  // ChatML
  bool skip_empty_system_ = false;             // Phi-3.5
  std::string date_;                           // Llama-3.1: "Today Date: {date_}"; gpt-oss: "Current date: {date_}"
  ChatSpecialTokens tokens_;
};

}  // namespace oomb

#endif  // OOMB_WORKER_HF_CHAT_TEMPLATE_H_
