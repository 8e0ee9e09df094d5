// Tests of the BPE trainer (engine/tokenizer/bpe_trainer.h): its output loads, round-trips, and
// is deterministic; bad arguments are errors.
#include "engine/tokenizer/bpe_trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace moe::engine {
namespace {

const std::vector<std::string> kSpecials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

TEST(BpeTrainerTest, TrainedTokenizerRoundTrips) {
  absl::StatusOr<std::string> json = TrainTokenizerJson(DefaultCorpus(), 1024, kSpecials);
  ASSERT_TRUE(json.ok()) << json.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJson(*json);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_LE((*tok)->vocab_size(), 1024);
  EXPECT_GT((*tok)->vocab_size(), 256 + 3 + 200);  // it learned a useful number of merges
  for (const std::string s :
       {"The model predicts one token after another.", "def softmax(xs):\n    return xs\n",
        "  spaces\tand\ttabs \r\n", "\u4e2d\u6587 \U0001F600 caf\u00e9", "unseen zyxwv 12345",
        "<|im_start|>user\nhi<|im_end|>\n", ""}) {
    absl::StatusOr<std::vector<int32_t>> ids = (*tok)->Encode(s);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*(*tok)->Decode(*ids), s);
  }
  // Common words of the corpus became single tokens; specials are one id each.
  EXPECT_EQ((*tok)->Encode(" the")->size(), 1u);
  std::vector<int32_t> chat = *(*tok)->Encode("<|im_start|><|im_end|><|endoftext|>");
  EXPECT_EQ(chat.size(), 3u);
  EXPECT_TRUE((*tok)->IsSpecial(chat[0]));
}

TEST(BpeTrainerTest, Deterministic) {
  EXPECT_EQ(*TrainTokenizerJson(DefaultCorpus(), 600, kSpecials),
            *TrainTokenizerJson(DefaultCorpus(), 600, kSpecials));
}

TEST(BpeTrainerTest, StopsWhenNothingRepeats) {
  absl::StatusOr<std::string> json = TrainTokenizerJson("abc", 5000, {});
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ((*Tokenizer::FromJson(*json))->vocab_size(), 256);
}

TEST(BpeTrainerTest, BadArguments) {
  EXPECT_EQ(TrainTokenizerJson("abc", 258, kSpecials).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainTokenizerJson("abc", 300, {"<a>", "<a>"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainTokenizerJson("abc", 300, {""}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainTokenizerJson("ab\xff", 300, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BpeTrainerTest, LoadFromDirReadsTheChatMlConfig) {
  std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "bpe_trainer_test_model";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << *TrainTokenizerJson(DefaultCorpus(), 400, kSpecials);
  std::ofstream(dir / "tokenizer_config.json") << ChatMlTokenizerConfigJson();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::LoadFromDir(dir.string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->chat_template().source(), ::testing::HasSubstr("<|im_start|>"));
  EXPECT_EQ((*tok)->eos_token(), "<|im_end|>");
  EXPECT_EQ((*tok)->bos_token(), std::nullopt);
  EXPECT_TRUE((*tok)->TokenId("<|im_end|>").has_value());

  std::ofstream(dir / "tokenizer_config.json") << "{broken";
  EXPECT_EQ(Tokenizer::LoadFromDir(dir.string()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::LoadFromDir((dir / "missing").string()).status().code(),
            absl::StatusCode::kNotFound);
}

// The template is compiled at load: the built-in model's ChatML renders, a template that does not
// parse fails the load with file, line and column, and chat_template.jinja is read when the config
// has none.
TEST(BpeTrainerTest, LoadFromDirCompilesTheChatTemplate) {
  std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "bpe_trainer_test_template";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << *TrainTokenizerJson(DefaultCorpus(), 300, kSpecials);
  std::ofstream(dir / "tokenizer_config.json") << ChatMlTokenizerConfigJson();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::LoadFromDir(dir.string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const TemplateJson messages = {{{"role", "user"}, {"content", "Hi"}}};
  EXPECT_EQ(*(*tok)->chat_template().Render(messages, nullptr, nullptr, true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");

  std::ofstream(dir / "tokenizer_config.json")
      << R"({"eos_token": "<|im_end|>", "chat_template": "{% for m in messages %}\n{{ m.content }"})";
  absl::Status st = Tokenizer::LoadFromDir(dir.string()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(),
              ::testing::HasSubstr(
                  "tokenizer_config.json: chat template: line 2, column 1: '{{' is never closed"));

  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<|im_end|>"})";
  std::ofstream(dir / "chat_template.jinja") << "{{ eos_token }}{{ messages | length }}";
  tok = Tokenizer::LoadFromDir(dir.string());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(*(*tok)->chat_template().Render(messages, nullptr, nullptr, true), "<|im_end|>1");

  // A tokenizer made from tokenizer.json alone has the built-in ChatML template.
  auto bare = Tokenizer::FromJson(*TrainTokenizerJson(DefaultCorpus(), 300, kSpecials));
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ((*bare)->chat_template().source(), ChatMlTemplate());
}

}  // namespace
}  // namespace moe::engine
