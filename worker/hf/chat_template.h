// Chat formatting for supervised fine-tuning: renders a conversation the way the model's own
// Jinja chat template (tokenizer_config.json "chat_template") does, and reports where each
// assistant reply sits in the text so training can restrict the loss to assistant turns.
//
// oomb does not run Jinja. It recognises the template families it trains and renders them
// natively; the tests check the output against transformers' apply_chat_template:
//   kChatMl  (Qwen2, Qwen2.5, SmolLM2):  "<|im_start|>{role}\n{content}<|im_end|>\n" per
//            message, preceded by the template's default system message (when it has one)
//            if the first message is not a system message.
//   kLlama3  (Llama-3 / 3-Instruct):   "{bos}" once, then per message
//            "<|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>".
// Other templates (Llama-3.1+ with its date header, Qwen3 with <think> handling, Mistral,
// Gemma, ...) are UNIMPLEMENTED, with the family named in the message.
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
  size_t content_begin = 0;  // first byte of the (trimmed, for Llama-3) content
  size_t content_end = 0;    // one past its last byte
  size_t turn_end = 0;       // one past the end-of-turn marker (<|im_end|> / <|eot_id|>), for
                             // callers that also train the model to stop
};

struct RenderedChat {
  std::string text;
  std::vector<AssistantSpan> assistant_spans;  // in message order
};

enum class ChatFamily { kChatMl, kLlama3 };

// "chatml" or "llama3".
std::string_view ChatFamilyName(ChatFamily family);

class ChatTemplate {
 public:
  // Recognises the family of the Jinja `template_text`. `bos_token` is what the template's
  // `bos_token` variable holds (Llama-3 only; "<|begin_of_text|>" when empty).
  // INVALID_ARGUMENT when `template_text` is empty (the model has no chat template);
  // UNIMPLEMENTED naming the family for templates outside the list above.
  static absl::StatusOr<ChatTemplate> FromJinja(std::string_view template_text, std::string_view bos_token = "");

  ChatFamily family() const { return family_; }

  // The system message the template inserts when the conversation has none (ChatML only).
  const std::optional<std::string>& default_system() const { return default_system_; }

  // Renders `messages`; with `add_generation_prompt`, appends the header of an assistant turn.
  // INVALID_ARGUMENT naming the message index when a role is empty.
  absl::StatusOr<RenderedChat> Render(const std::vector<ChatMessage>& messages,
                                      bool add_generation_prompt = false) const;

 private:
  ChatTemplate() = default;

  ChatFamily family_ = ChatFamily::kChatMl;
  std::optional<std::string> default_system_;
  std::string bos_token_;
};

}  // namespace oomb

#endif  // OOMB_WORKER_HF_CHAT_TEMPLATE_H_
