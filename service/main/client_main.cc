// moe-client: a small command-line client of moe.v1: streams a generation's text to stdout and
// prints finish reason, usage and timings; --list_models lists what the frontend serves.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "kernels/base/flags.h"
#include "moe/v1/moe.grpc.pb.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "Frontend address");
ABSL_FLAG(std::string, model, "default", "Model name");
ABSL_FLAG(std::string, prompt, "", "Prompt text, sent as is (no chat template)");
ABSL_FLAG(std::string, user, "Write a short poem about the sea.",
          "A user chat message, used when --prompt is empty");
ABSL_FLAG(int32_t, max_tokens, 64, "Tokens to generate");
ABSL_FLAG(double, temperature, 0.7, "Sampling temperature; 0 is greedy");
ABSL_FLAG(uint64_t, seed, 0, "Sampling seed");
ABSL_FLAG(std::string, session_id, "", "Conversation id (keeps the KV for the next turn)");
ABSL_FLAG(double, timeout_seconds, 120, "Call deadline");
ABSL_FLAG(std::string, auth_token, "", "Sent as 'authorization: Bearer <token>' when set");
ABSL_FLAG(bool, list_models, false, "List the served models and exit");

namespace {

const char* FinishName(moe::v1::FinishReason r) {
  switch (r) {
    case moe::v1::FINISH_REASON_STOP:
      return "stop";
    case moe::v1::FINISH_REASON_LENGTH:
      return "length";
    case moe::v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    case moe::v1::FINISH_REASON_ERROR:
      return "error";
    default:
      return "unspecified";
  }
}

void Prepare(grpc::ClientContext* ctx) {
  ctx->set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_timeout_seconds) * 1000)));
  if (!absl::GetFlag(FLAGS_auth_token).empty()) {
    ctx->AddMetadata("authorization", "Bearer " + absl::GetFlag(FLAGS_auth_token));
  }
}

int Fail(const char* what, const grpc::Status& st) {
  std::fprintf(stderr, "moe-client: %s: %d %s\n", what, static_cast<int>(st.error_code()),
               st.error_message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  moe::base::ParseFlags(argc, argv,
      "Talks to moe-frontend.\n"
      "  moe-client --target=127.0.0.1:50051 --user='Hello!'\n"
      "  moe-client --list_models",
      __FILE__);
  auto stub = moe::v1::Inference::NewStub(
      grpc::CreateChannel(absl::GetFlag(FLAGS_target), grpc::InsecureChannelCredentials()));
  if (absl::GetFlag(FLAGS_list_models)) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    moe::v1::ListModelsResponse resp;
    const grpc::Status st = stub->ListModels(&ctx, moe::v1::ListModelsRequest(), &resp);
    if (!st.ok()) return Fail("ListModels", st);
    for (const auto& m : resp.models()) {
      std::printf("%s\t%s\tcontext %llu\tvocab %llu\t%u ready workers\n", m.name().c_str(),
                  m.architecture().c_str(), static_cast<unsigned long long>(m.context_length()),
                  static_cast<unsigned long long>(m.vocab_size()), m.ready_workers());
    }
    return 0;
  }
  moe::v1::GenerateRequest req;
  req.set_model(absl::GetFlag(FLAGS_model));
  if (!absl::GetFlag(FLAGS_prompt).empty()) {
    req.set_text(absl::GetFlag(FLAGS_prompt));
  } else {
    moe::v1::ChatMessage* m = req.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(absl::GetFlag(FLAGS_user));
  }
  req.set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
  req.mutable_sampling()->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  req.mutable_sampling()->set_seed(absl::GetFlag(FLAGS_seed));
  req.set_session_id(absl::GetFlag(FLAGS_session_id));

  grpc::ClientContext ctx;
  Prepare(&ctx);
  auto reader = stub->Generate(&ctx, req);
  moe::v1::GenerateResponse msg;
  moe::v1::Completion completion;
  while (reader->Read(&msg)) {
    std::cout << msg.text() << std::flush;
    if (msg.has_completion()) completion = msg.completion();
  }
  std::cout << std::endl;
  const grpc::Status st = reader->Finish();
  if (!st.ok()) return Fail("Generate", st);
  const auto& u = completion.usage();
  const auto& t = completion.timings();
  std::fprintf(
      stderr,
      "[client] finish=%s prompt_tokens=%llu cached=%llu completion_tokens=%llu "
      "ttft=%.1f ms total=%.1f ms worker=%s\n",
      FinishName(completion.finish_reason()), static_cast<unsigned long long>(u.prompt_tokens()),
      static_cast<unsigned long long>(u.cached_prompt_tokens()),
      static_cast<unsigned long long>(u.completion_tokens()), t.time_to_first_token_seconds() * 1e3,
      t.total_seconds() * 1e3, completion.worker().c_str());
  return 0;
}
