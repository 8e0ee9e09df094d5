// Anthropic messages over moe.v1.Generate.
#include "service/http/anthropic_api.h"

#include <optional>

#include "service/http/output_splitter.h"

namespace moe::service::http {
namespace {

using moe::v1::ChatMessage;
using moe::v1::Completion;
using moe::v1::GenerateResponse;

std::string Event(const char* name, const json& data) {
  return std::string("event: ") + name + "\ndata: " + data.dump() + "\n\n";
}

// One message's content (a string, or blocks: text, thinking, tool_use, tool_result) -> chat
// turns. tool_result blocks become "tool" turns, in order, before the turn's text.
void ReadContent(const std::string& role, const json& content, const std::string& at,
                 moe::v1::ChatMessages* chat) {
  if (content.is_string()) {
    ChatMessage* m = chat->add_messages();
    m->set_role(role);
    m->set_content(content.get<std::string>());
    return;
  }
  if (!content.is_array()) BadField(at, "must be a string or an array of content blocks");
  ChatMessage turn;
  turn.set_role(role);
  for (size_t i = 0; i < content.size(); ++i) {
    const json& b = content[i];
    const std::string where = at + "[" + std::to_string(i) + "]";
    if (!b.is_object()) BadField(where, "must be an object");
    const std::string type = GetString(b, "type").value_or("");
    if (type == "text") {
      turn.mutable_content()->append(GetString(b, "text").value_or(""));
    } else if (type == "thinking") {
      turn.mutable_reasoning_content()->append(GetString(b, "thinking").value_or(""));
    } else if (type == "redacted_thinking") {
      // Opaque to us: nothing to render.
    } else if (type == "tool_use") {
      std::optional<std::string> name = GetString(b, "name");
      if (!name || name->empty()) BadField(where + ".name", "is required");
      moe::v1::ToolCall* call = turn.add_tool_calls();
      call->set_id(GetString(b, "id").value_or(""));
      call->set_name(*name);
      call->set_arguments(b.contains("input") && b["input"].is_object() ? b["input"].dump() : "{}");
    } else if (type == "tool_result") {
      ChatMessage* tool = chat->add_messages();
      tool->set_role("tool");
      tool->set_tool_call_id(GetString(b, "tool_use_id").value_or(""));
      if (b.contains("content")) tool->set_content(TextOf(b["content"], where + ".content"));
    } else {
      BadField(where + ".type", "'" + type +
                                    "' is not supported (text, thinking, tool_use, "
                                    "tool_result)");
    }
  }
  if (!turn.content().empty() || turn.tool_calls_size() > 0 || !turn.reasoning_content().empty()) {
    *chat->add_messages() = std::move(turn);
  }
}

// tools [{name, description, input_schema}] -> OpenAI function definitions; tool_choice
// {type: auto|any|tool|none}: none sends no tools, tool sends only the named one, any is not
// enforced (as OpenAI's "required").
bool ReadTools(const json& body, moe::v1::ChatMessages* chat) {
  const auto it = body.find("tools");
  if (it == body.end() || it->is_null()) return false;
  if (!it->is_array()) BadField("tools", "must be an array");
  std::optional<std::string> only;
  if (const auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    if (!c->is_object()) BadField("tool_choice", "must be an object");
    const std::string type = GetString(*c, "type").value_or("");
    if (type == "none") return false;
    if (type == "tool") {
      only = GetString(*c, "name");
      if (!only) BadField("tool_choice.name", "is required with type tool");
    } else if (type != "auto" && type != "any") {
      BadField("tool_choice.type", "must be auto, any, tool or none");
    }
  }
  json tools = json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) BadField(at, "must be an object");
    std::optional<std::string> name = GetString(t, "name");
    if (!name || name->empty()) BadField(at + ".name", "is required");
    if (only && *only != *name) continue;
    json fn = {
        {"name", *name},
        {"parameters", t.contains("input_schema") ? t["input_schema"] : json{{"type", "object"}}}};
    if (auto d = GetString(t, "description")) fn["description"] = *d;
    tools.push_back({{"type", "function"}, {"function", fn}});
  }
  if (only && tools.empty()) BadField("tool_choice.name", "names no tool in tools");
  if (tools.empty()) return false;
  chat->set_tools_json(tools.dump());
  return true;
}

std::string StopReason(const Completion& c, bool tool_use) {
  if (c.finish_reason() == moe::v1::FINISH_REASON_LENGTH) return "max_tokens";
  // The proto does not say whether an EOS or a stop string ended it: end_turn for both.
  return tool_use ? "tool_use" : "end_turn";
}

class MessagesRenderer final : public Renderer {
 public:
  MessagesRenderer(const ParsedRequest& p)
      : stream_(p.stream), parse_tools_(p.parse_tools), model_(p.request.model()) {}

  std::string OnMessage(const GenerateResponse& r) override {
    std::string out;
    if (!started_) {
      started_ = true;
      id_ = "msg_" + r.request_id();
      splitter_.emplace(r.prompt_opens_thinking(), parse_tools_);
      if (stream_) {
        // Usage is known only at the end: message_delta carries input_tokens too.
        json msg = Message(json::array());
        msg["usage"] = {{"input_tokens", 0}, {"output_tokens", 0}};
        out += Event("message_start", {{"type", "message_start"}, {"message", msg}});
      }
    }
    std::vector<OutputPiece> pieces = splitter_->Push(r.text());
    if (r.has_completion()) {
      for (OutputPiece& p : splitter_->Finish()) pieces.push_back(std::move(p));
    }
    for (const OutputPiece& p : pieces) out += Add(p);
    return out;
  }

  std::string OnEnd(const Completion& c) override {
    const std::string reason = StopReason(c, splitter_->saw_tool_call());
    // Anthropic's input_tokens leaves out the tokens read from the cache (the total is their sum).
    const uint64_t cached = c.usage().cached_prompt_tokens();
    const json usage = {{"input_tokens", c.usage().prompt_tokens() - cached},
                        {"output_tokens", c.usage().completion_tokens()},
                        {"cache_read_input_tokens", cached}};
    if (!stream_) {
      json msg = Message(blocks_);
      msg["stop_reason"] = reason;
      msg["usage"] = usage;
      return msg.dump();
    }
    std::string out = CloseBlock();
    out += Event("message_delta", {{"type", "message_delta"},
                                   {"delta", {{"stop_reason", reason}, {"stop_sequence", nullptr}}},
                                   {"usage", usage}});
    return out + Event("message_stop", {{"type", "message_stop"}});
  }

  std::string StreamError(const ApiError& e) override {
    return Event("error", json::parse(AnthropicErrorBody(e)));
  }

 private:
  json Message(json content) const {
    return {{"id", id_},
            {"type", "message"},
            {"role", "assistant"},
            {"model", model_},
            {"content", content},
            {"stop_reason", nullptr},
            {"stop_sequence", nullptr}};
  }

  // Non-streaming: appends to blocks_. Streaming: the events (a new block when the kind changes).
  std::string Add(const OutputPiece& p) {
    using Kind = OutputPiece::Kind;
    const char* type = p.kind == Kind::kReasoning ? "thinking"
                       : p.kind == Kind::kContent ? "text"
                                                  : "tool_use";
    if (!stream_) {
      if (p.kind == Kind::kToolCall) {
        blocks_.push_back({{"type", "tool_use"},
                           {"id", "toolu_" + RandomId()},
                           {"name", p.call.name},
                           {"input", json::parse(p.call.arguments)}});
      } else if (!blocks_.empty() && blocks_.back()["type"] == type) {
        blocks_.back()[type] = blocks_.back()[type].get<std::string>() + p.text;
      } else if (p.kind == Kind::kReasoning) {
        blocks_.push_back({{"type", "thinking"}, {"thinking", p.text}, {"signature", ""}});
      } else {
        blocks_.push_back({{"type", "text"}, {"text", p.text}});
      }
      return "";
    }
    std::string out;
    if (p.kind == Kind::kToolCall || open_type_ != type) {
      out += CloseBlock();
      json block;
      if (p.kind == Kind::kToolCall) {
        block = {{"type", "tool_use"},
                 {"id", "toolu_" + RandomId()},
                 {"name", p.call.name},
                 {"input", json::object()}};
      } else if (p.kind == Kind::kReasoning) {
        block = {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}};
      } else {
        block = {{"type", "text"}, {"text", ""}};
      }
      out += Event("content_block_start",
                   {{"type", "content_block_start"}, {"index", index_}, {"content_block", block}});
      open_type_ = type;
    }
    json delta;
    if (p.kind == Kind::kToolCall) {
      delta = {{"type", "input_json_delta"}, {"partial_json", p.call.arguments}};
    } else if (p.kind == Kind::kReasoning) {
      delta = {{"type", "thinking_delta"}, {"thinking", p.text}};
    } else {
      delta = {{"type", "text_delta"}, {"text", p.text}};
    }
    out += Event("content_block_delta",
                 {{"type", "content_block_delta"}, {"index", index_}, {"delta", delta}});
    if (p.kind == Kind::kToolCall) out += CloseBlock();
    return out;
  }

  std::string CloseBlock() {
    if (open_type_.empty()) return "";
    open_type_.clear();
    return Event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_++}});
  }

  const bool stream_, parse_tools_;
  const std::string model_;
  bool started_ = false;
  std::string id_;
  std::optional<OutputSplitter> splitter_;
  json blocks_ = json::array();
  std::string open_type_;  // streaming: the open block's type; empty: none open
  int index_ = 0;
};

}  // namespace

ParsedRequest ParseMessages(const json& body) {
  ParsedRequest p;
  if (!body.is_object()) BadField("body", "must be a JSON object");
  std::optional<std::string> model = GetString(body, "model");
  if (!model || model->empty()) BadField("model", "is required");
  p.request.set_model(*model);
  std::optional<int64_t> max_tokens = GetInt(body, "max_tokens");
  if (!max_tokens) BadField("max_tokens", "is required");
  if (*max_tokens < 1 || *max_tokens > UINT32_MAX) BadField("max_tokens", "must be at least 1");
  p.request.set_max_tokens(static_cast<uint32_t>(*max_tokens));
  ReadSampling(body, &p.request);
  ReadStop(body, "stop_sequences", &p.request);
  p.stream = GetBool(body, "stream").value_or(false);

  moe::v1::ChatMessages* chat = p.request.mutable_chat();
  if (const auto s = body.find("system"); s != body.end() && !s->is_null()) {
    ChatMessage* m = chat->add_messages();
    m->set_role("system");
    m->set_content(TextOf(*s, "system"));
  }
  const auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) {
    BadField("messages", "must be a non-empty array");
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) BadField(at, "must be an object");
    std::optional<std::string> role = GetString(m, "role");
    if (!role || (*role != "user" && *role != "assistant")) {
      BadField(at + ".role", "must be user or assistant");
    }
    if (!m.contains("content")) BadField(at + ".content", "is required");
    ReadContent(*role, m["content"], at + ".content", chat);
  }
  p.parse_tools = ReadTools(body, chat);
  if (const auto t = body.find("thinking"); t != body.end() && !t->is_null()) {
    if (!t->is_object()) BadField("thinking", "must be an object");
    const std::string type = GetString(*t, "type").value_or("");
    if (type != "enabled" && type != "disabled") {
      BadField("thinking.type", "must be enabled or disabled");
    }
    chat->set_template_kwargs_json(json{{"enable_thinking", type == "enabled"}}.dump());
  }
  return p;
}

std::unique_ptr<Renderer> MakeMessagesRenderer(const ParsedRequest& request) {
  return std::make_unique<MessagesRenderer>(request);
}

std::string AnthropicErrorBody(const ApiError& e) {
  return json{{"type", "error"}, {"error", {{"type", e.type}, {"message", e.message}}}}.dump();
}

}  // namespace moe::service::http
