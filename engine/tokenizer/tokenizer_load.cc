// Tokenizer::LoadFromDir: reads tokenizer.json and the optional tokenizer_config.json.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/base/status.h"
#include "nlohmann/json.hpp"

namespace moe::engine {
namespace {
using nlohmann::json;

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path.string()));
  return text.str();
}

bool Exists(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

// eos_token/bos_token are either a string or an AddedToken-like object {"content": ...}.
std::optional<std::string> TokenString(const json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

// chat_template is a string, or a list of {"name", "template"} of which "default" is used.
absl::StatusOr<std::string> ChatTemplateSource(const json& config) {
  if (!config.contains("chat_template") || config["chat_template"].is_null()) return std::string();
  const json& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const json& entry : t) {
      if (entry.is_object() && entry.value("name", "") == "default") {
        return entry.at("template").get<std::string>();
      }
    }
  }
  return absl::InvalidArgumentError(
      "tokenizer_config.json: chat_template is neither a string nor a list with a 'default'");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::LoadFromDir(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  MOE_ASSIGN_OR_RETURN(std::string text, ReadFile(dir / "tokenizer.json"));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = FromJson(text);
  if (!tok.ok()) return base::Annotate(tok.status(), (dir / "tokenizer.json").string());

  std::string chat_source;
  std::filesystem::path chat_path;  // where chat_source came from, for errors
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  if (Exists(config_path)) {
    MOE_ASSIGN_OR_RETURN(std::string config_text, ReadFile(config_path));
    try {
      json config = json::parse(config_text);
      if (!config.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(config_path.string(), ": not an object"));
      }
      absl::StatusOr<std::string> chat_template = ChatTemplateSource(config);
      if (!chat_template.ok()) return base::Annotate(chat_template.status(), config_path.string());
      chat_source = *std::move(chat_template);
      chat_path = config_path;
      (*tok)->eos_token_ = TokenString(config, "eos_token");
      (*tok)->bos_token_ = TokenString(config, "bos_token");
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(config_path.string(), ": ", e.what()));
    }
  }
  const std::filesystem::path jinja_path = dir / "chat_template.jinja";
  if (chat_source.empty() && Exists(jinja_path)) {
    MOE_ASSIGN_OR_RETURN(chat_source, ReadFile(jinja_path));
    chat_path = jinja_path;
  }
  if (!chat_source.empty()) {
    absl::StatusOr<ChatTemplate> chat = ChatTemplate::Compile(
        std::move(chat_source), (*tok)->bos_token_.value_or(""), (*tok)->eos_token_.value_or(""));
    if (!chat.ok()) return base::Annotate(chat.status(), chat_path.string() + ": chat template");
    (*tok)->chat_template_ = *std::move(chat);
  }
  return tok;
}

}  // namespace moe::engine
