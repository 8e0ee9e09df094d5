// The OpenAI API: POST /v1/chat/completions, POST /v1/completions, GET /v1/models. Request
// bodies -> moe.v1.GenerateRequest; Generate streams -> chat.completion(.chunk) and
// text_completion objects; errors as {"error": {"message", "type", "param", "code"}}.
#pragma once

#include <memory>
#include <string>

#include "service/http/api_common.h"

namespace moe::service::http {

// Throw RequestError (400) naming the field at fault.
ParsedRequest ParseChatCompletion(const json& body);
ParsedRequest ParseCompletion(const json& body);

// `texts` serves logprobs' token texts; it must outlive the renderer.
std::unique_ptr<Renderer> MakeChatRenderer(const ParsedRequest& request, TokenTexts* texts);
std::unique_ptr<Renderer> MakeCompletionRenderer(const ParsedRequest& request, TokenTexts* texts);

std::string OpenAiErrorBody(const ApiError& error);
json OpenAiModelList(const moe::v1::ListModelsResponse& models);

}  // namespace moe::service::http
