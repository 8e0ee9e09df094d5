// OpenAI chat completions and completions over moe.v1.Generate.
#include "service/http/openai_api.h"

#include "service/http/output_splitter.h"

namespace moe::service::http {
namespace {

using moe::v1::ChatMessage;
using moe::v1::Completion;
using moe::v1::FinishReason;
using moe::v1::GenerateResponse;

std::string Sse(const json& j) { return "data: " + j.dump() + "\n\n"; }

// model, max_tokens / max_completion_tokens, n, sampling, stop, logprobs: shared by both.
void ReadCommon(const json& body, ParsedRequest* p) {
  if (!body.is_object()) BadField("body", "must be a JSON object");
  std::optional<std::string> model = GetString(body, "model");
  if (!model || model->empty()) BadField("model", "is required (see GET /v1/models)");
  p->request.set_model(*model);
  std::optional<int64_t> max_tokens = GetInt(body, "max_completion_tokens");
  if (!max_tokens) max_tokens = GetInt(body, "max_tokens");
  if (max_tokens) {
    if (*max_tokens < 1 || *max_tokens > UINT32_MAX) {
      BadField(body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens",
               "must be at least 1");
    }
    p->request.set_max_tokens(static_cast<uint32_t>(*max_tokens));
  }
  if (auto n = GetInt(body, "n"); n && *n != 1) BadField("n", "only 1 is supported");
  ReadSampling(body, &p->request);
  ReadStop(body, "stop", &p->request);
  p->stream = GetBool(body, "stream").value_or(false);
  if (const auto it = body.find("stream_options"); it != body.end() && it->is_object()) {
    p->include_usage = GetBool(*it, "include_usage").value_or(false);
  }
}

json Usage(const Completion& c) {
  const auto& u = c.usage();
  return {{"prompt_tokens", u.prompt_tokens()},
          {"completion_tokens", u.completion_tokens()},
          {"total_tokens", u.prompt_tokens() + u.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_prompt_tokens()}}}};
}

std::string Finish(const Completion& c, bool tool_calls) {
  switch (c.finish_reason()) {
    case moe::v1::FINISH_REASON_LENGTH:
      return "length";
    case moe::v1::FINISH_REASON_CANCELLED:
      return "abort";  // as vLLM says it
    default:
      return tool_calls ? "tool_calls" : "stop";
  }
}

void ReadMessage(const json& m, const std::string& at, ChatMessage* out) {
  if (!m.is_object()) BadField(at, "must be an object");
  std::optional<std::string> role = GetString(m, "role");
  if (!role || role->empty()) BadField(at + ".role", "is required");
  out->set_role(*role == "developer" ? "system" : *role);
  if (m.contains("content")) out->set_content(TextOf(m["content"], at + ".content"));
  if (auto r = GetString(m, "reasoning_content")) out->set_reasoning_content(*r);
  if (auto id = GetString(m, "tool_call_id")) out->set_tool_call_id(*id);
  if (auto name = GetString(m, "name"); name && *role == "tool") out->set_name(*name);
  if (const auto it = m.find("tool_calls"); it != m.end() && !it->is_null()) {
    if (!it->is_array()) BadField(at + ".tool_calls", "must be an array");
    for (size_t i = 0; i < it->size(); ++i) {
      const json& tc = (*it)[i];
      const std::string where = at + ".tool_calls[" + std::to_string(i) + "]";
      const json* fn = tc.is_object() && tc.contains("function") ? &tc["function"] : nullptr;
      if (fn == nullptr || !fn->is_object()) BadField(where + ".function", "is required");
      std::optional<std::string> name = GetString(*fn, "name");
      if (!name || name->empty()) BadField(where + ".function.name", "is required");
      moe::v1::ToolCall* call = out->add_tool_calls();
      call->set_id(GetString(tc, "id").value_or(""));
      call->set_name(*name);
      if (const auto a = fn->find("arguments"); a != fn->end() && !a->is_null()) {
        call->set_arguments(a->is_string() ? a->get<std::string>() : a->dump());
      }
    }
  }
}

// tools + tool_choice -> tools_json. "none" sends no tools; a named function sends only that
// one; "required" is not enforced (no constrained decoding): the model may still answer in text.
bool ReadTools(const json& body, moe::v1::ChatMessages* chat) {
  const auto it = body.find("tools");
  if (it == body.end() || it->is_null()) return false;
  if (!it->is_array()) BadField("tools", "must be an array");
  json tools = *it;
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || t.value("type", "function") != "function" || !t.contains("function") ||
        !t["function"].is_object() || !t["function"].contains("name") ||
        !t["function"]["name"].is_string()) {
      BadField(at, "must be {\"type\": \"function\", \"function\": {\"name\", ...}}");
    }
  }
  if (const auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    if (c->is_string()) {
      const std::string choice = c->get<std::string>();
      if (choice == "none") return false;
      if (choice != "auto" && choice != "required") {
        BadField("tool_choice", "must be none, auto, required or a named function");
      }
    } else if (c->is_object() && c->contains("function") && (*c)["function"].is_object() &&
               (*c)["function"].contains("name") && (*c)["function"]["name"].is_string()) {
      const std::string name = (*c)["function"]["name"].get<std::string>();
      json only = json::array();
      for (const json& t : tools) {
        if (t["function"]["name"] == name) only.push_back(t);
      }
      if (only.empty()) BadField("tool_choice.function.name", "names no tool in tools");
      tools = only;
    } else {
      BadField("tool_choice", "must be none, auto, required or a named function");
    }
  }
  if (tools.empty()) return false;
  chat->set_tools_json(tools.dump());
  return true;
}

class ChatRenderer final : public Renderer {
 public:
  ChatRenderer(const ParsedRequest& p, TokenTexts* texts)
      : stream_(p.stream),
        include_usage_(p.include_usage),
        parse_tools_(p.parse_tools),
        logprobs_(p.request.logprobs()),
        model_(p.request.model()),
        texts_(texts) {}

  std::string OnMessage(const GenerateResponse& r) override {
    std::string out;
    if (!started_) {
      started_ = true;
      id_ = "chatcmpl-" + r.request_id();
      splitter_.emplace(r.prompt_opens_thinking(), parse_tools_);
      if (stream_) out += Chunk({{"role", "assistant"}, {"content", ""}}, nullptr);
    }
    json logprobs = logprobs_ ? ChatLogprobs(r, *texts_) : json();
    std::vector<OutputPiece> pieces = splitter_->Push(r.text());
    if (r.has_completion()) {
      for (OutputPiece& p : splitter_->Finish()) pieces.push_back(std::move(p));
    }
    if (!stream_) {
      for (const OutputPiece& p : pieces) Accumulate(p);
      if (logprobs_) {
        for (json& e : logprobs) logprob_content_.push_back(std::move(e));
      }
      return "";
    }
    json delta = json::object();
    for (const OutputPiece& p : pieces) {
      if (p.kind == OutputPiece::Kind::kToolCall) {
        if (!delta.empty()) out += Chunk(std::exchange(delta, json::object()), nullptr);
        out += Chunk({{"tool_calls", json::array({ToolCallJson(p.call, tool_index_++)})}}, nullptr);
      } else {
        const char* key = p.kind == OutputPiece::Kind::kReasoning ? "reasoning_content" : "content";
        if (!delta.empty()) out += Chunk(std::exchange(delta, json::object()), nullptr);
        delta[key] = p.text;
      }
    }
    if (!delta.empty() || (logprobs_ && !logprobs.empty())) {
      out += Chunk(delta, logprobs_ ? &logprobs : nullptr);
    }
    return out;
  }

  std::string OnEnd(const Completion& c) override {
    const std::string finish = Finish(c, splitter_->saw_tool_call());
    if (stream_) {
      json chunk = Base("chat.completion.chunk");
      chunk["choices"] = json::array({{{"index", 0},
                                       {"delta", json::object()},
                                       {"logprobs", nullptr},
                                       {"finish_reason", finish}}});
      std::string out = Sse(chunk);
      if (include_usage_) {
        json usage = Base("chat.completion.chunk");
        usage["choices"] = json::array();
        usage["usage"] = Usage(c);
        out += Sse(usage);
      }
      return out + "data: [DONE]\n\n";
    }
    json message = {
        {"role", "assistant"},
        {"content", content_.empty() && !tool_calls_.empty() ? json() : json(content_)}};
    if (!reasoning_.empty()) message["reasoning_content"] = reasoning_;
    if (!tool_calls_.empty()) message["tool_calls"] = tool_calls_;
    json body = Base("chat.completion");
    body["choices"] =
        json::array({{{"index", 0},
                      {"message", message},
                      {"logprobs", logprobs_ ? json{{"content", logprob_content_}} : json()},
                      {"finish_reason", finish}}});
    body["usage"] = Usage(c);
    return body.dump();
  }

  std::string StreamError(const ApiError& e) override {
    return Sse(json::parse(OpenAiErrorBody(e)));
  }

 private:
  json Base(const char* object) const {
    json j = {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
    return j;
  }
  std::string Chunk(const json& delta, const json* logprobs) const {
    json chunk = Base("chat.completion.chunk");
    chunk["choices"] = json::array({{{"index", 0},
                                     {"delta", delta},
                                     {"logprobs", logprobs ? json{{"content", *logprobs}} : json()},
                                     {"finish_reason", nullptr}}});
    if (include_usage_) chunk["usage"] = nullptr;
    return Sse(chunk);
  }
  static json ToolCallJson(const ParsedToolCall& call, int index) {
    return {{"index", index},
            {"id", "call_" + RandomId()},
            {"type", "function"},
            {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
  }
  void Accumulate(const OutputPiece& p) {
    if (p.kind == OutputPiece::Kind::kToolCall) {
      json tc = ToolCallJson(p.call, tool_index_++);
      tc.erase("index");
      tool_calls_.push_back(tc);
    } else if (p.kind == OutputPiece::Kind::kReasoning) {
      reasoning_ += p.text;
    } else {
      content_ += p.text;
    }
  }

  const bool stream_, include_usage_, parse_tools_, logprobs_;
  const std::string model_;
  TokenTexts* texts_;
  const int64_t created_ = UnixSeconds();
  bool started_ = false;
  std::string id_;
  std::optional<OutputSplitter> splitter_;
  int tool_index_ = 0;
  std::string content_, reasoning_;
  json tool_calls_ = json::array();
  json logprob_content_ = json::array();
};

// Legacy completions: text in, text out (no reasoning or tool parsing).
class CompletionRenderer final : public Renderer {
 public:
  CompletionRenderer(const ParsedRequest& p, TokenTexts* texts)
      : stream_(p.stream),
        include_usage_(p.include_usage),
        logprobs_(p.request.logprobs()),
        model_(p.request.model()),
        texts_(texts) {}

  std::string OnMessage(const GenerateResponse& r) override {
    if (id_.empty()) id_ = "cmpl-" + r.request_id();
    json lp;
    if (logprobs_) {
      lp = {{"tokens", json::array()},
            {"token_logprobs", json::array()},
            {"top_logprobs", json::array()}};
      for (int i = 0; i < r.logprobs_size() && i < r.token_ids_size(); ++i) {
        lp["tokens"].push_back(texts_->Text(r.token_ids(i)));
        lp["token_logprobs"].push_back(r.logprobs(i).logprob());
        json top = json::object();
        for (const auto& t : r.logprobs(i).top()) top[texts_->Text(t.token_id())] = t.logprob();
        lp["top_logprobs"].push_back(top);
      }
    }
    if (!stream_) {
      text_ += r.text();
      if (logprobs_) {
        for (const char* k : {"tokens", "token_logprobs", "top_logprobs"}) {
          for (json& v : lp[k]) all_logprobs_[k].push_back(std::move(v));
        }
      }
      return "";
    }
    if (r.text().empty() && !(logprobs_ && r.token_ids_size() > 0)) return "";
    return Sse(Body(r.text(), std::move(lp), nullptr));
  }

  std::string OnEnd(const Completion& c) override {
    if (stream_) {
      std::string out = Sse(Body("", json(), Finish(c, false).c_str()));
      if (include_usage_) {
        json usage = Body("", json(), nullptr);
        usage["choices"] = json::array();
        usage["usage"] = Usage(c);
        out += Sse(usage);
      }
      return out + "data: [DONE]\n\n";
    }
    json body = Body(text_, logprobs_ ? all_logprobs_ : json(), Finish(c, false).c_str());
    body["usage"] = Usage(c);
    return body.dump();
  }

  std::string StreamError(const ApiError& e) override {
    return Sse(json::parse(OpenAiErrorBody(e)));
  }

 private:
  json Body(const std::string& text, json logprobs, const char* finish) const {
    return {{"id", id_},
            {"object", "text_completion"},
            {"created", created_},
            {"model", model_},
            {"choices", json::array({{{"index", 0},
                                      {"text", text},
                                      {"logprobs", std::move(logprobs)},
                                      {"finish_reason", finish ? json(finish) : json()}}})}};
  }

  const bool stream_, include_usage_, logprobs_;
  const std::string model_;
  TokenTexts* texts_;
  const int64_t created_ = UnixSeconds();
  std::string id_, text_;
  json all_logprobs_ = {{"tokens", json::array()},
                        {"token_logprobs", json::array()},
                        {"top_logprobs", json::array()}};
};

}  // namespace

ParsedRequest ParseChatCompletion(const json& body) {
  ParsedRequest p;
  ReadCommon(body, &p);
  const auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) {
    BadField("messages", "must be a non-empty array");
  }
  moe::v1::ChatMessages* chat = p.request.mutable_chat();
  for (size_t i = 0; i < it->size(); ++i) {
    ReadMessage((*it)[i], "messages[" + std::to_string(i) + "]", chat->add_messages());
  }
  p.parse_tools = ReadTools(body, chat);
  if (const auto k = body.find("chat_template_kwargs"); k != body.end() && !k->is_null()) {
    if (!k->is_object()) BadField("chat_template_kwargs", "must be an object");
    chat->set_template_kwargs_json(k->dump());
  }
  if (auto lp = GetBool(body, "logprobs")) p.request.set_logprobs(*lp);
  if (auto top = GetInt(body, "top_logprobs")) {
    if (*top < 0 || *top > 20) BadField("top_logprobs", "must be in [0, 20]");
    if (!p.request.logprobs()) BadField("top_logprobs", "needs logprobs: true");
    p.request.set_top_logprobs(static_cast<uint32_t>(*top));
  }
  return p;
}

ParsedRequest ParseCompletion(const json& body) {
  ParsedRequest p;
  ReadCommon(body, &p);
  const auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) BadField("prompt", "is required");
  if (it->is_string()) {
    p.request.set_text(it->get<std::string>());
  } else if (it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
    p.request.set_text((*it)[0].get<std::string>());
  } else if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) {
    for (size_t i = 0; i < it->size(); ++i) {
      const json& id = (*it)[i];
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > UINT32_MAX) {
        BadField("prompt[" + std::to_string(i) + "]", "must be a token id");
      }
      p.request.mutable_token_ids()->add_ids(id.get<uint32_t>());
    }
  } else {
    BadField("prompt", "must be a string, a list of one string, or a list of token ids");
  }
  if (auto echo = GetBool(body, "echo"); echo && *echo) BadField("echo", "is not supported");
  if (auto suffix = GetString(body, "suffix"); suffix && !suffix->empty()) {
    BadField("suffix", "is not supported");
  }
  if (auto lp = GetInt(body, "logprobs")) {
    if (*lp < 0 || *lp > 20) BadField("logprobs", "must be in [0, 20]");
    p.request.set_logprobs(true);
    p.request.set_top_logprobs(static_cast<uint32_t>(*lp));
  }
  return p;
}

std::unique_ptr<Renderer> MakeChatRenderer(const ParsedRequest& request, TokenTexts* texts) {
  return std::make_unique<ChatRenderer>(request, texts);
}

std::unique_ptr<Renderer> MakeCompletionRenderer(const ParsedRequest& request, TokenTexts* texts) {
  return std::make_unique<CompletionRenderer>(request, texts);
}

std::string OpenAiErrorBody(const ApiError& e) {
  return json{{"error",
               {{"message", e.message},
                {"type", e.type},
                {"param", e.param.empty() ? json() : json(e.param)},
                {"code", e.code.empty() ? json() : json(e.code)}}}}
      .dump();
}

json OpenAiModelList(const moe::v1::ListModelsResponse& models) {
  json data = json::array();
  for (const moe::v1::ModelInfo& m : models.models()) {
    data.push_back({{"id", m.name()},
                    {"object", "model"},
                    {"created", 0},
                    {"owned_by", "moe-serve"},
                    {"max_model_len", m.context_length()}});
  }
  return {{"object", "list"}, {"data", data}};
}

}  // namespace moe::service::http
