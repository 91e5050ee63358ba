#include "worker/hf/chat_template.h"

#include <cctype>
#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/test_env.h"
#include "tests/worker/test_files.h"
#include "worker/common/file_access.h"
#include "worker/data/dataset.h"
#include "worker/hf/tokenizer.h"

namespace oomb {
namespace {

using ::testing::HasSubstr;

std::string SmolDir() { return testing::DataDir() + "/models/SmolLM2-135M-Instruct"; }
std::string GemmaDir() { return testing::DataDir() + "/models/gemma-3-270m"; }
// A scratch model directory holding Gemma-3-270M's tokenizer.json.
std::string WithGemmaTokenizer(const std::string& name) {
  const std::string dir = testing::ScratchDir(name);
  std::filesystem::copy_file(GemmaDir() + "/tokenizer.json", dir + "/tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  return dir;
}
std::string TemplatePath(const std::string& name) {
  return testing::SourceDir() + "/tests/worker/hf/testdata/" + name + "_chat_template.jinja";
}

struct Case {
  std::vector<ChatMessage> messages;
  bool add_generation_prompt;
};

// Every family renders every case; where the family's template refuses one (roles that do not
// alternate, roles it does not know), Render must refuse it too.
std::vector<Case> Cases() {
  return {
      {{{"user", "Hi"}}, false},
      {{{"user", "Hi"}}, true},
      {{{"system", "Be terse."}, {"user", "2+2?"}, {"assistant", "4"}}, false},
      {{{"system", "Be terse."}, {"user", "2+2?"}, {"assistant", "4"}, {"user", "3+3?"}}, true},
      {{{"user", "  padded \n"}, {"assistant", "\n answer with spaces  \t"}, {"user", "thanks"}}, true},
      {{{"user", "multi\nline\n\ncontent"}, {"assistant", "日本語 😀 café"}, {"user", "x"}, {"assistant", "y"}}, false},
      {{{"system", ""}, {"user", ""}, {"assistant", ""}}, false},
      {{{"user", "q"}, {"assistant", "a"}, {"tool", "result"}}, false},
      {{{"user", "q"}, {"tool", "t1"}, {"tool", "t2"}, {"assistant", "b"}}, false},
      {{{"assistant", "first"}}, false},
      {{{"user", "u"}, {"user", "again"}}, false},
      {{{"system", "s1"}, {"user", "u"}, {"system", "s2"}}, true},
      {{{"user", "q1"},
        {"assistant", "<think>\nreason\n</think>\n\nanswer"},
        {"user", "q2"},
        {"assistant", "<think>r2</think>a2"}},
       false},
      {{{"user", "q1"}, {"assistant", "pre<think>\n\nr1\n</think>\n\n\na1\n"}, {"assistant", "no think"}}, false},
      {{{"user", "<tool_response>x</tool_response>"}, {"assistant", "<think>a</think>b"}}, false},
  };
}

// Conversations where gpt-oss's template differs from the others: a leading developer message,
// a lone system message, later system and developer messages (left out), <|channel|> tags in the
// content (refused in an assistant's content only), a tool message after the developer message.
std::vector<Case> HarmonyCases() {
  return {
      {{{"developer", "Dev says"}, {"user", "u"}, {"assistant", "a"}}, true},
      {{{"developer", "D"}, {"user", "u"}, {"assistant", "a"}}, false},
      {{{"system", "only"}}, true},
      {{{"system", "only"}}, false},
      {{{"user", "u"}, {"assistant", "a"}, {"assistant", "b"}}, true},
      {{{"system", "s"}, {"developer", "d"}, {"user", "u"}, {"ipython", "i"}, {"assistant", "a"}}, false},
      {{{"user", "<|channel|>final<|message|>u"}, {"assistant", "x<|channel|>commentary<|message|>y"}}, false},
      {{{"user", "u"}, {"assistant", "x<|channel|>final<|message|>y"}}, false},
      {{{"user", "u"}, {"assistant", "<|channel|>analysis<|message|>y"}, {"user", "v"}}, true},
      {{{"system", "s"}, {"tool", "t"}}, false},
      {{{"developer", ""}, {"assistant", " a \n"}}, false},
  };
}

// Renders `cases` with transformers' apply_chat_template (the tokenizer's own template when
// `template_file` is empty); nullopt for the cases the template refuses. Empty (the test skips)
// without the venv or the test data.
std::vector<std::optional<std::string>> Reference(const std::string& template_file, const ChatSpecialTokens& tokens,
                                                  const std::vector<Case>& cases) {
  const std::string py = testing::VenvPython();
  if (py.empty() || !std::filesystem::exists(SmolDir())) return {};
  const std::string dir = testing::ScratchDir("chat_ref");
  nlohmann::json json_cases = nlohmann::json::array();
  for (const Case& c : cases) {
    nlohmann::json msgs = nlohmann::json::array();
    for (const ChatMessage& m : c.messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
    json_cases.push_back({{"messages", msgs}, {"add_generation_prompt", c.add_generation_prompt}});
  }
  EXPECT_TRUE(FileAccess::Unconfined()->OpenDir(dir)->WriteFileAtomic("cases.json", json_cases.dump()).ok());
  std::string cmd = py + " " + testing::SourceDir() + "/tests/python/chat_template_reference.py --tokenizer-dir " +
                    SmolDir() + " --cases " + dir + "/cases.json --out " + dir + "/out.json";
  if (!template_file.empty()) {
    cmd += " --template " + template_file + " --bos '" + tokens.bos + "' --eos '" + tokens.eos + "'";
  }
  if (testing::RunCommand(cmd + " 2>/dev/null") != 0) {
    ADD_FAILURE() << "reference failed: " << cmd;
    return {};
  }
  std::vector<std::optional<std::string>> out;
  for (const auto& v : nlohmann::json::parse(*FileAccess::Unconfined()->ReadFile(dir + "/out.json"))) {
    out.push_back(v.is_null() ? std::nullopt : std::optional<std::string>(v.get<std::string>()));
  }
  return out;
}

// The reply as the model writes it, less a leading Qwen3 <think> block.
std::string WithoutThinkBlock(const std::string& reply) {
  const std::string close = "</think>\n\n";
  if (reply.rfind("<think>\n", 0) != 0) return reply;
  const size_t at = reply.find(close);
  return at == std::string::npos ? reply : reply.substr(at + close.size());
}

// `last_end_marker` ends an assistant message that ends the conversation without a generation
// prompt (gpt-oss's <|return|>); `end_marker` every other one.
void CheckAgainstReference(const ChatTemplate& ct, const std::vector<Case>& cases,
                           const std::vector<std::optional<std::string>>& want, const std::string& end_marker,
                           const std::string& last_end_marker) {
  ASSERT_EQ(want.size(), cases.size());
  int refused = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    auto r = ct.Render(cases[i].messages, cases[i].add_generation_prompt);
    if (!want[i]) {
      ++refused;
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << "case " << i << ": the template refuses it";
      continue;
    }
    ASSERT_TRUE(r.ok()) << "case " << i << ": " << r.status();
    EXPECT_EQ(r->text, *want[i]) << "case " << i;
    // Each span covers an assistant message's reply as written, followed by the end marker.
    size_t k = 0;
    const std::vector<ChatMessage>& messages = cases[i].messages;
    for (size_t j = 0; j < messages.size(); ++j) {
      const ChatMessage& m = messages[j];
      if (m.role != "assistant") continue;
      ASSERT_LT(k, r->assistant_spans.size());
      const AssistantSpan& s = r->assistant_spans[k++];
      const std::string reply = r->text.substr(s.content_begin, s.content_end - s.content_begin);
      EXPECT_NE(m.content.find(WithoutThinkBlock(reply)), std::string::npos) << "case " << i << ": " << reply;
      const bool ends = j + 1 == messages.size() && !cases[i].add_generation_prompt;
      EXPECT_EQ(r->text.substr(s.content_end, s.turn_end - s.content_end), ends ? last_end_marker : end_marker)
          << "case " << i;
    }
    EXPECT_EQ(k, r->assistant_spans.size());
  }
  ::testing::Test::RecordProperty("refused_cases", refused);
}

TEST(ChatTemplateTest, SmolLm2MatchesTransformers) {
  if (!std::filesystem::exists(SmolDir())) GTEST_SKIP() << "test data not found at " << SmolDir();
  auto tok = Tokenizer::FromModelDir(testing::OpenDir(SmolDir()));
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto ct = ChatTemplate::FromJinja((*tok)->chat_template());
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->family(), ChatFamily::kChatMl);
  EXPECT_EQ(ct->default_system(), "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  const auto want = Reference("", {}, Cases());
  if (want.empty()) GTEST_SKIP() << "Python venv not found (set OOMB_VENV or run the setup script)";
  CheckAgainstReference(*ct, Cases(), want, "<|im_end|>", "<|im_end|>");
}

struct FamilyCase {
  std::string template_name;  // tests/worker/hf/testdata/<name>_chat_template.jinja
  ChatSpecialTokens tokens;
  ChatFamily family;
  std::string end_marker;
  std::string last_end_marker;  // of an assistant message that ends the conversation (no generation prompt)
};

void PrintTo(const FamilyCase& c, std::ostream* os) { *os << c.template_name; }

class ChatFamilyTest : public ::testing::TestWithParam<FamilyCase> {};

TEST_P(ChatFamilyTest, MatchesTransformers) {
  const FamilyCase& fc = GetParam();
  auto text = FileAccess::Unconfined()->ReadFile(TemplatePath(fc.template_name));
  ASSERT_TRUE(text.ok()) << text.status();
  auto ct = ChatTemplate::FromJinja(*text, fc.tokens);
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->family(), fc.family);
  const auto want = Reference(TemplatePath(fc.template_name), fc.tokens, Cases());
  if (want.empty()) GTEST_SKIP() << "Python venv or test data not found";
  CheckAgainstReference(*ct, Cases(), want, fc.end_marker, fc.last_end_marker);
}

INSTANTIATE_TEST_SUITE_P(
    Families, ChatFamilyTest,
    ::testing::Values(FamilyCase{"llama3", {"<|begin_of_text|>", ""}, ChatFamily::kLlama3, "<|eot_id|>", "<|eot_id|>"},
                      FamilyCase{"qwen3", {}, ChatFamily::kQwen3, "<|im_end|>", "<|im_end|>"},
                      FamilyCase{"gemma3", {"<bos>", "<eos>"}, ChatFamily::kGemma, "<end_of_turn>", "<end_of_turn>"},
                      FamilyCase{"mistral_v0.3", {"<s>", "</s>"}, ChatFamily::kMistral, "</s>", "</s>"},
                      FamilyCase{"phi3", {"<s>", "<|endoftext|>"}, ChatFamily::kPhi3, "<|end|>", "<|end|>"},
                      FamilyCase{"phi3.5", {"<s>", "<|endoftext|>"}, ChatFamily::kPhi3, "<|end|>", "<|end|>"},
                      FamilyCase{"phi4_mini", {"", "<|endoftext|>"}, ChatFamily::kPhi4Mini, "<|end|>", "<|end|>"},
                      // gpt-oss writes its special tokens as text: no bos_token or eos_token.
                      FamilyCase{"gpt_oss", {}, ChatFamily::kHarmony, "<|end|>", "<|return|>"}),
    [](const ::testing::TestParamInfo<FamilyCase>& info) {
      std::string name;
      for (char c : info.param.template_name) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      return name;
    });

TEST(ChatTemplateTest, FamiliesThatNeedSpecialTokensSayWhich) {
  auto text = FileAccess::Unconfined()->ReadFile(TemplatePath("mistral_v0.3"));
  ASSERT_TRUE(text.ok());
  auto ct = ChatTemplate::FromJinja(*text, {"<s>", ""});
  ASSERT_FALSE(ct.ok());
  EXPECT_EQ(ct.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ct.status().message()), HasSubstr("eos_token"));
  text = FileAccess::Unconfined()->ReadFile(TemplatePath("gemma3"));
  ASSERT_TRUE(text.ok());
  ct = ChatTemplate::FromJinja(*text);
  ASSERT_FALSE(ct.ok());
  EXPECT_THAT(std::string(ct.status().message()), HasSubstr("bos_token"));
}

// A Gemma 3 model directory (the real Gemma-3-270M tokenizer, with the Gemma 3 template in its
// tokenizer_config.json): the dataset reader renders chats with the model's own <bos>, tokenizes
// them as a whole and puts the loss on the model's turns; a conversation the template refuses is
// an error naming its line.
TEST(ChatTemplateTest, GemmaModelDirectoryTrainsOnModelTurns) {
  if (!std::filesystem::exists(GemmaDir())) GTEST_SKIP() << "test data not found at " << GemmaDir();
  const std::string dir = WithGemmaTokenizer("chat_gemma_model");
  auto config = nlohmann::json::parse(*FileAccess::Unconfined()->ReadFile(GemmaDir() + "/tokenizer_config.json"));
  config["chat_template"] = *FileAccess::Unconfined()->ReadFile(TemplatePath("gemma3"));
  Dir model = testing::OpenDir(dir);
  ASSERT_TRUE(model.WriteFileAtomic("tokenizer_config.json", config.dump()).ok());
  ASSERT_TRUE(
      model
          .WriteFileAtomic("chat.jsonl",
                           R"({"messages": [{"role": "system", "content": "Be brief."}, )"
                           R"({"role": "user", "content": "Hi"}, {"role": "assistant", "content": " Hello! "}]})"
                           "\n")
          .ok());
  ASSERT_TRUE(
      model
          .WriteFileAtomic("bad.jsonl",
                           "{\"text\": \"x\"}\n{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}]}\n")
          .ok());

  ModelTokenizer model_tokenizer(model, "model.path");
  auto docs = ReadJsonlDataset(*testing::OpenFile(dir + "/chat.jsonl"), model_tokenizer.Loader(), {}, nullptr);
  ASSERT_TRUE(docs.ok()) << docs.status();
  auto tok = Tokenizer::FromModelDir(model);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string text =
      "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n";
  const std::vector<int32_t> ids = (*tok)->Encode(text);
  ASSERT_EQ((*docs)[0].ids, std::vector<int64_t>(ids.begin(), ids.end()));
  EXPECT_EQ((*docs)[0].ids[0], *(*tok)->bos_id());
  std::vector<int32_t> labelled;
  for (const int64_t l : (*docs)[0].labels) {
    if (l >= 0) labelled.push_back(static_cast<int32_t>(l));
  }
  EXPECT_EQ(*(*tok)->Decode(labelled), "Hello!<end_of_turn>");

  ModelTokenizer again(model, "model.path");
  auto bad = ReadJsonlDataset(*testing::OpenFile(dir + "/bad.jsonl"), again.Loader(), {}, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("bad.jsonl:2: message 0 ('assistant')"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("alternate user/assistant"));
}

// A template oomb does not render: 'messages' samples are refused with the family named.
TEST(ChatTemplateTest, UnsupportedTemplateIsNamedWhenAChatIsRead) {
  if (!std::filesystem::exists(GemmaDir())) GTEST_SKIP() << "test data not found at " << GemmaDir();
  const std::string dir = WithGemmaTokenizer("chat_unsupported_model");
  Dir model = testing::OpenDir(dir);
  ASSERT_TRUE(model.WriteFileAtomic("tokenizer_config.json", R"({"chat_template": "{{ '<start_of_turn>' }}"})").ok());
  ASSERT_TRUE(model.WriteFileAtomic("chat.jsonl", R"({"messages": [{"role": "user", "content": "Hi"}]})").ok());
  ModelTokenizer model_tokenizer(model, "model.path");
  auto docs = ReadJsonlDataset(*testing::OpenFile(dir + "/chat.jsonl"), model_tokenizer.Loader(), {}, nullptr);
  ASSERT_FALSE(docs.ok());
  EXPECT_EQ(docs.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(docs.status().message()),
              HasSubstr("chat.jsonl:1: the model has no supported chat template"));
  EXPECT_THAT(std::string(docs.status().message()), HasSubstr("'gemma' other than Gemma 2's and 3's"));
}

TEST(ChatTemplateTest, Qwen2DefaultSystemWithEscapedNewline) {
  // Qwen2.5 writes '\n' as an escape inside the Jinja string literal.
  const std::string t =
      R"({%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }})"
      R"({%- else %}{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }})"
      R"({%- endif %})";
  auto ct = ChatTemplate::FromJinja(t);
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->default_system(), "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  auto r = ct->Render({{"user", "hi"}, {"assistant", "yo"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n");
  ASSERT_EQ(r->assistant_spans.size(), 1u);
  EXPECT_EQ(r->text.substr(r->assistant_spans[0].content_begin, 2), "yo");
}

// Llama-3.1, Gemma 2 and Mistral-Nemo, whose templates are not in the test data: each expected
// string is what the model's own template (tokenizer_config.json) renders, read off its Jinja
// rule by rule. The recognised templates here hold the lines the families are told by.
const char* const kLlama31Lines =
    R"({%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %})"
    R"({{- "<|start_header_id|>system<|end_header_id|>\n\n" }}{{- "Cutting Knowledge Date: December 2023\n" }})"
    R"({{- "Today Date: " + date_string + "\n\n" }}{%- if tools_in_user_message and not tools is none %})";

TEST(ChatTemplateTest, Llama31WritesTheDateHeaderAndToolResultsAsJson) {
  auto ct = ChatTemplate::FromJinja(kLlama31Lines);
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->family(), ChatFamily::kLlama31);
  auto r = ct->Render(
      {{"system", " Be terse.\n"}, {"user", " 2+2? "}, {"assistant", "\n4 "}, {"tool", "{\"x\": \"a\\b\"}\n"}}, true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(
      r->text,
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
      "Today Date: 26 Jul 2024\n\nBe terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n"
      "\"{\\\"x\\\": \\\"a\\\\b\\\"}\\n\"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  ASSERT_EQ(r->assistant_spans.size(), 1u);
  EXPECT_EQ(r->text.substr(r->assistant_spans[0].content_begin, 2), "4<");
  // No system message: the header's system turn is empty; a later system message is a turn.
  r = ct->Render({{"user", "hi"}, {"system", "s"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
            "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>system<|end_header_id|>\n\ns<|eot_id|>");
  // Llama-3.2's template dates the header with strftime_now: the day it was loaded.
  const std::string before = absl::FormatTime("%d %b %Y", absl::Now(), absl::LocalTimeZone());
  auto dated = ChatTemplate::FromJinja(std::string(kLlama31Lines) + R"({%- if strftime_now is defined %})");
  const std::string after = absl::FormatTime("%d %b %Y", absl::Now(), absl::LocalTimeZone());
  ASSERT_TRUE(dated.ok());
  r = dated->Render({{"user", "hi"}});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(absl::StrContains(r->text, "Today Date: " + before + "\n") ||
              absl::StrContains(r->text, "Today Date: " + after + "\n"))
      << r->text;
}

TEST(ChatTemplateTest, Gemma2RefusesASystemMessage) {
  const std::string t =
      "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
      "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}";
  auto ct = ChatTemplate::FromJinja(t, {"<bos>", "<eos>"});
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->family(), ChatFamily::kGemma2);
  auto r = ct->Render({{"user", " Hi "}, {"assistant", " Hello! "}, {"user", "Bye"}}, true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text,
            "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  ASSERT_EQ(r->assistant_spans.size(), 1u);
  EXPECT_EQ(r->text.substr(r->assistant_spans[0].content_begin,
                           r->assistant_spans[0].turn_end - r->assistant_spans[0].content_begin),
            "Hello!<end_of_turn>");
  auto refused = ct->Render({{"system", "s"}, {"user", "u"}});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("system role"));
  EXPECT_EQ(ct->Render({{"assistant", "a"}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ChatTemplate::FromJinja(t).ok());  // Gemma 2 needs its bos_token
}

TEST(ChatTemplateTest, MistralNemoWritesNoSpacesAndRefusesToolMessages) {
  const std::string t =
      R"({%- if loop.last and system_message is defined %}{{- "[INST]" + system_message + "\n\n" + message["content"] + "[/INST]" }})"
      R"({%- else %}{{- "[INST]" + message["content"] + "[/INST]" }}{%- endif %})";
  auto ct = ChatTemplate::FromJinja(t, {"<s>", "</s>"});
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->family(), ChatFamily::kMistralNemo);
  auto r = ct->Render({{"system", "S"}, {"user", " u1"}, {"assistant", " a1 "}, {"user", "u2 "}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, "<s>[INST] u1[/INST] a1 </s>[INST]S\n\nu2 [/INST]");
  ASSERT_EQ(r->assistant_spans.size(), 1u);
  EXPECT_EQ(r->text.substr(r->assistant_spans[0].content_begin,
                           r->assistant_spans[0].turn_end - r->assistant_spans[0].content_begin),
            " a1 </s>");
  // The system message goes only before a user message that ends the conversation.
  r = ct->Render({{"system", "S"}, {"user", "u"}, {"assistant", "a"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "<s>[INST]u[/INST]a</s>");
  auto tool = ct->Render({{"user", "u"}, {"assistant", "a"}, {"tool", "r"}});
  EXPECT_EQ(tool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(tool.status().message()), HasSubstr("tool_call_id"));
  EXPECT_EQ(ct->Render({{"user", "u"}, {"user", "v"}}).status().code(), absl::StatusCode::kInvalidArgument);
}

// gpt-oss's system turn as its template writes it on `date` (no tools, default reasoning effort).
std::string HarmonySystem(const std::string& date) {
  return "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
         "Knowledge cutoff: 2024-06\nCurrent date: " +
         date +
         "\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for "
         "every message.<|end|>";
}

absl::StatusOr<ChatTemplate> GptOss() {
  auto text = FileAccess::Unconfined()->ReadFile(TemplatePath("gpt_oss"));
  if (!text.ok()) return text.status();
  return ChatTemplate::FromJinja(*text);
}

// On more conversations than the other families: those where harmony's rules differ.
TEST(ChatTemplateTest, GptOssMatchesTransformersOnHarmonyConversations) {
  auto ct = GptOss();
  ASSERT_TRUE(ct.ok()) << ct.status();
  const auto want = Reference(TemplatePath("gpt_oss"), {}, HarmonyCases());
  if (want.empty()) GTEST_SKIP() << "Python venv or test data not found";
  CheckAgainstReference(*ct, HarmonyCases(), want, "<|end|>", "<|return|>");
}

// The expected strings are what gpt-oss's template renders, read off its Jinja rule by rule and
// checked against transformers.
TEST(ChatTemplateTest, GptOssWritesTheHarmonyHeaderAndReturnAfterTheLastReply) {
  const std::string before = absl::FormatTime("%Y-%m-%d", absl::Now(), absl::LocalTimeZone());
  auto ct = GptOss();
  const std::string after = absl::FormatTime("%Y-%m-%d", absl::Now(), absl::LocalTimeZone());
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->family(), ChatFamily::kHarmony);
  EXPECT_EQ(ChatFamilyName(ct->family()), "gpt-oss");
  auto r = ct->Render(
      {{"system", "Be terse."}, {"user", "2+2?"}, {"assistant", "4"}, {"user", "3+3?"}, {"assistant", " 6\n"}});
  ASSERT_TRUE(r.ok()) << r.status();
  // The date is the day the template was loaded.
  const std::string date = absl::StrContains(r->text, "Current date: " + before + "\n") ? before : after;
  EXPECT_EQ(r->text, HarmonySystem(date) +
                         "<|start|>developer<|message|># Instructions\n\nBe terse.\n\n<|end|>"
                         "<|start|>user<|message|>2+2?<|end|><|start|>assistant<|channel|>final<|message|>4<|end|>"
                         "<|start|>user<|message|>3+3?<|end|><|start|>assistant<|channel|>final<|message|> 6\n"
                         "<|return|>");
  ASSERT_EQ(r->assistant_spans.size(), 2u);
  const auto piece = [&r](size_t begin, size_t end) { return r->text.substr(begin, end - begin); };
  const AssistantSpan first = r->assistant_spans[0];
  const AssistantSpan last = r->assistant_spans[1];
  EXPECT_EQ(piece(first.content_begin, first.content_end), "4");
  EXPECT_EQ(piece(first.content_end, first.turn_end), "<|end|>");
  EXPECT_EQ(piece(last.content_begin, last.content_end), " 6\n");
  EXPECT_EQ(piece(last.content_end, last.turn_end), "<|return|>");
  EXPECT_EQ(last.turn_end, r->text.size());
  // With a generation prompt the last reply ends <|end|>. A leading developer message is the
  // instructions too; later system and developer messages, and other roles, are left out.
  r = ct->Render({{"developer", "D"}, {"user", "u"}, {"system", "s"}, {"developer", "d"}, {"assistant", "a"}}, true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, HarmonySystem(date) +
                         "<|start|>developer<|message|># Instructions\n\nD\n\n<|end|><|start|>user<|message|>u<|end|>"
                         "<|start|>assistant<|channel|>final<|message|>a<|end|><|start|>assistant");
  // An empty system message writes no developer turn.
  r = ct->Render({{"system", ""}, {"assistant", "a"}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, HarmonySystem(date) + "<|start|>assistant<|channel|>final<|message|>a<|return|>");
}

TEST(ChatTemplateTest, GptOssRefusesToolMessagesAndChannelTagsInReplies) {
  auto ct = GptOss();
  ASSERT_TRUE(ct.ok()) << ct.status();
  const auto expect_refused = [&ct](const std::vector<ChatMessage>& messages, const std::string& fragment) {
    auto r = ct->Render(messages);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << fragment;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(fragment));
  };
  expect_refused({{"user", "q"}, {"assistant", "a"}, {"tool", "r"}},
                 "message 2 ('tool'): the chat template needs an earlier assistant message with a tool call "
                 "(tool_calls)");
  expect_refused({{"user", "q"}, {"assistant", "x<|channel|>analysis<|message|>y"}},
                 "message 1 ('assistant'): the chat template refuses <|channel|> tags");
  expect_refused({{"user", "q"}, {"assistant", "<|channel|>final<|message|>y"}}, "'thinking' field");
  expect_refused({}, "at least one message");
  // Other tags, and channel tags outside an assistant's content, are text.
  auto r = ct->Render({{"user", "<|channel|>final<|message|>u"}, {"assistant", "x<|channel|>commentary<|message|>y"}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(absl::StrContains(r->text,
                                "<|start|>user<|message|><|channel|>final<|message|>u<|end|>"
                                "<|start|>assistant<|channel|>final<|message|>x<|channel|>commentary<|message|>y"
                                "<|return|>"))
      << r->text;
}

// `text` with the first `from` replaced by `to`.
std::string Replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// Harmony templates that render plain conversations otherwise are not taken for gpt-oss's.
TEST(ChatTemplateTest, GptOssVariantsAreUnimplemented) {
  auto text = FileAccess::Unconfined()->ReadFile(TemplatePath("gpt_oss"));
  ASSERT_TRUE(text.ok()) << text.status();
  const auto expect_unimplemented = [](const std::string& t) {
    auto ct = ChatTemplate::FromJinja(t);
    ASSERT_FALSE(ct.ok());
    EXPECT_EQ(ct.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(ct.status().message()), HasSubstr("'harmony' other than gpt-oss's"));
  };
  // Unsloth's variant ends the last reply <|end|>.
  expect_unimplemented(Replaced(*text, R"(message.content + "<|return|>" }})", R"(message.content + "<|end|>" }})"));
  // The revision before the current one writes no "\n\n" after the developer instructions.
  expect_unimplemented(
      Replaced(*text, "{{- developer_message }}\n        {{- \"\\n\\n\" }}", "{{- developer_message }}"));
  // A template whose generation prompt is another.
  expect_unimplemented(
      Replaced(*text, "\n<|start|>assistant\n{%- endif -%}", "\n<|start|>assistant<|channel|>\n{%- endif -%}"));
}

TEST(ChatTemplateTest, UnsupportedFamiliesAreNamed) {
  auto expect = [](const std::string& t, const std::string& fragment) {
    auto ct = ChatTemplate::FromJinja(t);
    ASSERT_FALSE(ct.ok());
    EXPECT_EQ(ct.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(ct.status().message()), HasSubstr(fragment));
  };
  expect("{{ bos_token }}[INST] {{ m }} [/INST]", "mistral");
  expect(R"({{ '[SYSTEM_PROMPT]' }}{{ "[INST] " + system_message + "\n\n" }})", "mistral");
  expect("{{ '<|user|>' + message['content'] + '<|end|>' + '<|assistant|>' }}", "zephyr/phi");
  expect("<start_of_turn>user", "gemma' other than Gemma 2's and 3's");
  expect("<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023", "llama3.x");
  expect("<|im_start|>assistant\n<think>\n", "chatml-reasoning");
  expect(std::string(kLlama31Lines) + "<|image|>", "llama3.x");
  expect(R"({{- "<|start|>assistant<|channel|>final<|message|>" }})", "'harmony' other than gpt-oss's");
  expect("{{ messages }}", "unknown");
  EXPECT_EQ(ChatTemplate::FromJinja("").status().code(), absl::StatusCode::kInvalidArgument);
  auto ct = ChatTemplate::FromJinja("<|im_start|>");
  ASSERT_TRUE(ct.ok());
  EXPECT_EQ(ct->Render({{"", "x"}}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace oomb
