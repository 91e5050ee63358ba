#include "worker/hf/chat_template.h"

#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/test_env.h"
#include "tests/worker/test_files.h"
#include "worker/common/file_access.h"
#include "worker/hf/tokenizer.h"

namespace oomb {
namespace {

using ::testing::HasSubstr;

std::string SmolDir() { return testing::DataDir() + "/models/SmolLM2-135M-Instruct"; }
std::string Llama3TemplatePath() {
  return testing::SourceDir() + "/tests/worker/hf/testdata/llama3_chat_template.jinja";
}

struct Case {
  std::vector<ChatMessage> messages;
  bool add_generation_prompt;
};

std::vector<Case> Cases() {
  return {
      {{{"user", "Hi"}}, false},
      {{{"user", "Hi"}}, true},
      {{{"system", "Be terse."}, {"user", "2+2?"}, {"assistant", "4"}}, false},
      {{{"user", "  padded \n"}, {"assistant", "\n answer with spaces  \t"}, {"user", "thanks"}}, true},
      {{{"user", "multi\nline\n\ncontent"}, {"assistant", "日本語 😀 café"}, {"user", "x"}, {"assistant", "y"}}, false},
      {{{"system", ""}, {"user", ""}, {"assistant", ""}}, false},
      {{{"user", "q"}, {"assistant", "a"}, {"tool", "result"}}, false},
  };
}

// Renders every case with transformers' apply_chat_template; nullopt (test skips) without venv.
std::vector<std::string> Reference(const std::string& template_file, const std::string& bos) {
  const std::string py = testing::VenvPython();
  if (py.empty() || !std::filesystem::exists(SmolDir())) return {};
  const std::string dir = testing::ScratchDir("chat_ref");
  nlohmann::json cases = nlohmann::json::array();
  for (const Case& c : Cases()) {
    nlohmann::json msgs = nlohmann::json::array();
    for (const ChatMessage& m : c.messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
    cases.push_back({{"messages", msgs}, {"add_generation_prompt", c.add_generation_prompt}});
  }
  EXPECT_TRUE(FileAccess::Unconfined()->OpenDir(dir)->WriteFileAtomic("cases.json", cases.dump()).ok());
  std::string cmd = py + " " + testing::SourceDir() + "/tests/python/chat_template_reference.py --tokenizer-dir " +
                    SmolDir() + " --cases " + dir + "/cases.json --out " + dir + "/out.json";
  if (!template_file.empty()) cmd += " --template " + template_file + " --bos '" + bos + "'";
  if (testing::RunCommand(cmd + " 2>/dev/null") != 0) {
    ADD_FAILURE() << "reference failed: " << cmd;
    return {};
  }
  return nlohmann::json::parse(*FileAccess::Unconfined()->ReadFile(dir + "/out.json")).get<std::vector<std::string>>();
}

void CheckAgainstReference(const ChatTemplate& ct, const std::vector<std::string>& want,
                           const std::string& end_marker) {
  const auto cases = Cases();
  ASSERT_EQ(want.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    auto r = ct.Render(cases[i].messages, cases[i].add_generation_prompt);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->text, want[i]) << "case " << i;
    // Each span covers an assistant message's (trimmed) content, followed by the end marker.
    size_t k = 0;
    for (const ChatMessage& m : cases[i].messages) {
      if (m.role != "assistant") continue;
      ASSERT_LT(k, r->assistant_spans.size());
      const AssistantSpan& s = r->assistant_spans[k++];
      const std::string content = r->text.substr(s.content_begin, s.content_end - s.content_begin);
      EXPECT_NE(m.content.find(content), std::string::npos) << "case " << i;
      EXPECT_EQ(r->text.substr(s.content_end, s.turn_end - s.content_end), end_marker);
    }
    EXPECT_EQ(k, r->assistant_spans.size());
  }
}

TEST(ChatTemplateTest, SmolLm2MatchesTransformers) {
  if (!std::filesystem::exists(SmolDir())) GTEST_SKIP() << "test data not found at " << SmolDir();
  auto tok = Tokenizer::FromModelDir(testing::OpenDir(SmolDir()));
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto ct = ChatTemplate::FromJinja((*tok)->chat_template());
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->family(), ChatFamily::kChatMl);
  EXPECT_EQ(ct->default_system(), "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  const auto want = Reference("", "");
  if (want.empty()) GTEST_SKIP() << "Python venv not found (set OOMB_VENV or run the setup script)";
  CheckAgainstReference(*ct, want, "<|im_end|>");
}

TEST(ChatTemplateTest, Llama3MatchesTransformers) {
  auto text = FileAccess::Unconfined()->ReadFile(Llama3TemplatePath());
  ASSERT_TRUE(text.ok()) << text.status();
  auto ct = ChatTemplate::FromJinja(*text, "<|begin_of_text|>");
  ASSERT_TRUE(ct.ok()) << ct.status();
  EXPECT_EQ(ct->family(), ChatFamily::kLlama3);
  const auto want = Reference(Llama3TemplatePath(), "<|begin_of_text|>");
  if (want.empty()) GTEST_SKIP() << "Python venv or test data not found";
  CheckAgainstReference(*ct, want, "<|eot_id|>");
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

TEST(ChatTemplateTest, UnsupportedFamiliesAreNamed) {
  auto expect = [](const std::string& t, const std::string& fragment) {
    auto ct = ChatTemplate::FromJinja(t);
    ASSERT_FALSE(ct.ok());
    EXPECT_EQ(ct.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(ct.status().message()), HasSubstr(fragment));
  };
  expect("{{ bos_token }}[INST] {{ m }} [/INST]", "mistral");
  expect("<start_of_turn>user", "gemma");
  expect("<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023", "llama3.1");
  expect("<|im_start|>assistant\n<think>\n", "chatml-reasoning");
  expect("{{ messages }}", "unknown");
  EXPECT_EQ(ChatTemplate::FromJinja("").status().code(), absl::StatusCode::kInvalidArgument);
  auto ct = ChatTemplate::FromJinja("<|im_start|>");
  ASSERT_TRUE(ct.ok());
  EXPECT_EQ(ct->Render({{"", "x"}}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace oomb
