// The Anthropic Messages API: POST /v1/messages. Request bodies -> moe.v1.GenerateRequest;
// Generate streams -> a "message" object, or the message_start ... message_stop events; errors
// as {"type": "error", "error": {"type", "message"}}.
#pragma once

#include <memory>
#include <string>

#include "service/http/api_common.h"

namespace moe::service::http {

// Throws RequestError (400) naming the field at fault.
ParsedRequest ParseMessages(const json& body);
std::unique_ptr<Renderer> MakeMessagesRenderer(const ParsedRequest& request);
std::string AnthropicErrorBody(const ApiError& error);

}  // namespace moe::service::http
