// moe_default_model_corpus: the C++ half of training the built-in default model
// (tests/default_model/README.md). Three jobs, one per flag:
//   --train_tokenizer=DIR  trains the byte-level BPE tokenizer (engine's trainer) on --text and
//                          writes DIR/tokenizer.json and DIR/tokenizer_config.json (ChatML)
//   --encode=OUT.bin       encodes --text with DIR's tokenizer (special tokens allowed) into
//                          little-endian uint16 ids, "<|endoftext|>" after every document
//                          (documents are apart by a blank line)
//   --perplexity           held-out perplexity of --model on --text, computed by the engine
//                          (CPU backend), beside a unigram baseline counted on --unigram_ids
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/model.h"
#include "engine/sequence_kv.h"
#include "engine/tokenizer/bpe_trainer.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/base/flags.h"
#include "kernels/base/status.h"

ABSL_FLAG(std::string, text, "", "Input text file");
ABSL_FLAG(std::string, train_tokenizer, "", "Train a tokenizer on --text into this directory");
ABSL_FLAG(int32_t, vocab, 4096, "Tokenizer vocabulary size, special tokens included");
ABSL_FLAG(std::string, tokenizer, "", "Directory with tokenizer.json (for --encode)");
ABSL_FLAG(std::string, encode, "", "Encode --text into this .bin file of uint16 ids");
ABSL_FLAG(bool, perplexity, false, "Held-out perplexity of --model on --text");
ABSL_FLAG(std::string, model, "", "Model directory (for --perplexity)");
ABSL_FLAG(std::string, unigram_ids, "", ".bin ids whose counts make the unigram baseline");
ABSL_FLAG(int32_t, window, 256, "Tokens per perplexity window (each scored from a fresh cache)");
ABSL_FLAG(int32_t, max_tokens, 20000, "Most held-out tokens scored");

namespace moe {
namespace {

const std::vector<std::string> kSpecialTokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::Status WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
  return out.good() ? absl::OkStatus() : absl::InternalError(absl::StrCat(path, ": write failed"));
}

absl::StatusOr<std::vector<int32_t>> ReadIds(const std::string& path) {
  MOE_ASSIGN_OR_RETURN(const std::string bytes, ReadFile(path));
  std::vector<int32_t> ids(bytes.size() / 2);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<uint8_t>(bytes[2 * i]) | (static_cast<uint8_t>(bytes[2 * i + 1]) << 8);
  }
  return ids;
}

absl::Status TrainTokenizer(const std::string& text, const std::string& dir) {
  MOE_ASSIGN_OR_RETURN(
      const std::string json,
      engine::TrainTokenizerJson(text, absl::GetFlag(FLAGS_vocab), kSpecialTokens));
  MOE_RETURN_IF_ERROR(WriteFile(dir + "/tokenizer.json", json));
  return WriteFile(dir + "/tokenizer_config.json",
                   engine::ChatMlTokenizerConfigJson("<|im_end|>", "<|endoftext|>"));
}

absl::Status Encode(const std::string& text, const std::string& out_path) {
  MOE_ASSIGN_OR_RETURN(auto tokenizer,
                       engine::Tokenizer::LoadFromDir(absl::GetFlag(FLAGS_tokenizer)));
  const int32_t eot = *tokenizer->TokenId("<|endoftext|>");
  std::string out;
  int64_t documents = 0, tokens = 0;
  for (absl::string_view doc : absl::StrSplit(text, "\n\n", absl::SkipWhitespace())) {
    MOE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(doc, /*allow_special=*/true));
    ids.push_back(eot);
    for (int32_t id : ids) {
      if (id > 0xFFFF) return absl::OutOfRangeError("id does not fit uint16");
      out.push_back(static_cast<char>(id & 0xFF));
      out.push_back(static_cast<char>(id >> 8));
    }
    ++documents;
    tokens += static_cast<int64_t>(ids.size());
  }
  std::printf("%s: %lld documents, %lld tokens (%.2f bytes a token)\n", out_path.c_str(),
              static_cast<long long>(documents), static_cast<long long>(tokens),
              static_cast<double>(text.size()) / static_cast<double>(tokens));
  return WriteFile(out_path, out);
}

// Perplexity over windows of the held-out text: each window is prefilled from an empty cache and
// every position after its first is scored (natural log-probability of the next token).
absl::Status Perplexity(const std::string& text) {
  const std::string dir = absl::GetFlag(FLAGS_model);
  MOE_ASSIGN_OR_RETURN(auto backend, kernels::MakeBackend(kernels::BackendKind::kCpu, {}));
  MOE_ASSIGN_OR_RETURN(auto model, engine::Model::Load(dir, *backend));
  MOE_ASSIGN_OR_RETURN(auto tokenizer, engine::Tokenizer::LoadFromDir(dir));
  const int32_t eot = *tokenizer->TokenId("<|endoftext|>");
  std::vector<int32_t> ids;
  for (absl::string_view doc : absl::StrSplit(text, "\n\n", absl::SkipWhitespace())) {
    MOE_ASSIGN_OR_RETURN(std::vector<int32_t> d, tokenizer->Encode(doc, false));
    ids.insert(ids.end(), d.begin(), d.end());
    ids.push_back(eot);
    if (static_cast<int64_t>(ids.size()) >= absl::GetFlag(FLAGS_max_tokens)) break;
  }
  ids.resize(std::min<size_t>(ids.size(), absl::GetFlag(FLAGS_max_tokens)));

  // Unigram baseline: add-one counts over the training ids.
  const int64_t vocab = tokenizer->vocab_size();
  std::vector<double> counts(vocab, 1.0);
  double total = static_cast<double>(vocab);
  if (!absl::GetFlag(FLAGS_unigram_ids).empty()) {
    MOE_ASSIGN_OR_RETURN(const std::vector<int32_t> train,
                         ReadIds(absl::GetFlag(FLAGS_unigram_ids)));
    for (int32_t id : train) {
      if (id >= 0 && id < vocab) counts[id] += 1, total += 1;
    }
  }

  const int64_t window = absl::GetFlag(FLAGS_window);
  double nll = 0, unigram_nll = 0;
  int64_t scored = 0;
  for (size_t start = 0; start + 1 < ids.size(); start += window) {
    const size_t end = std::min(ids.size(), start + window);
    const absl::Span<const int32_t> tokens(ids.data() + start, end - start);
    MOE_ASSIGN_OR_RETURN(auto kv, engine::SequenceKv::Create(model->config(), *backend,
                                                             static_cast<int64_t>(tokens.size())));
    const engine::ForwardItem item{tokens, kv.get()};
    std::vector<float> logits;
    MOE_RETURN_IF_ERROR(model->Forward({&item, 1}, /*all_positions=*/true, &logits));
    const int64_t v = static_cast<int64_t>(logits.size() / tokens.size());
    for (size_t p = 0; p + 1 < tokens.size(); ++p) {
      const float* row = logits.data() + p * v;
      double max = row[0];
      for (int64_t j = 1; j < v; ++j) max = std::max<double>(max, row[j]);
      double sum = 0;
      for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - max);
      const int32_t next = tokens[p + 1];
      nll += max + std::log(sum) - row[next];
      unigram_nll += -std::log(counts[next] / total);
      ++scored;
    }
  }
  if (scored == 0) return absl::InvalidArgumentError("--text: nothing to score");
  std::printf("held-out tokens scored: %lld (windows of %lld)\n", static_cast<long long>(scored),
              static_cast<long long>(window));
  std::printf("model perplexity:   %.2f (%.3f nats a token)\n", std::exp(nll / scored),
              nll / scored);
  std::printf("unigram perplexity: %.2f (%.3f nats a token)\n", std::exp(unigram_nll / scored),
              unigram_nll / scored);
  return absl::OkStatus();
}

absl::Status Run() {
  MOE_ASSIGN_OR_RETURN(const std::string text, ReadFile(absl::GetFlag(FLAGS_text)));
  if (!absl::GetFlag(FLAGS_train_tokenizer).empty()) {
    return TrainTokenizer(text, absl::GetFlag(FLAGS_train_tokenizer));
  }
  if (!absl::GetFlag(FLAGS_encode).empty()) return Encode(text, absl::GetFlag(FLAGS_encode));
  if (absl::GetFlag(FLAGS_perplexity)) return Perplexity(text);
  return absl::InvalidArgumentError("one of --train_tokenizer, --encode, --perplexity is needed");
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  moe::base::ParseFlags(
      argc, argv,
      "Training-side tool of the built-in default model (tests/default_model/README.md).\n"
      "  moe_default_model_corpus --text=pretrain.txt --train_tokenizer=DIR --vocab=4096\n"
      "  moe_default_model_corpus --text=chat.txt --tokenizer=DIR --encode=chat.bin\n"
      "  moe_default_model_corpus --text=heldout.txt --model=DIR --perplexity "
      "--unigram_ids=pretrain.bin",
      __FILE__);
  const absl::Status status = moe::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "moe_default_model_corpus: %s\n", std::string(status.ToString()).c_str());
    return 1;
  }
  return 0;
}
