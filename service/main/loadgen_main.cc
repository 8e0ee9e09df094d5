// moe-loadgen: holds N concurrent Generate streams against a frontend for T seconds (each
// stream issues its next call as soon as the previous ends; calls still running at T are
// cancelled and counted as cut, not as errors) and reports throughput, time to first token and
// inter-token latency percentiles, and errors by status code. ghz measures
// whole calls only; this measures what a token stream's user feels.
#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/base/clock.h"
#include "kernels/base/flags.h"
#include "moe/v1/moe.grpc.pb.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "Frontend address");
ABSL_FLAG(std::string, model, "default", "Model name");
ABSL_FLAG(int32_t, concurrency, 8, "Streams held open at once");
ABSL_FLAG(double, duration_seconds, 30, "How long to keep issuing calls");
ABSL_FLAG(int32_t, prompt_tokens, 128, "Prompt length (random token ids below vocab_size)");
ABSL_FLAG(std::string, text, "", "Use this text as the prompt instead of random ids");
ABSL_FLAG(int32_t, max_tokens, 128, "Tokens per call");
ABSL_FLAG(double, temperature, 0.0, "Sampling temperature");
ABSL_FLAG(bool, ignore_eos, true, "Generate max_tokens every time");
ABSL_FLAG(double, call_timeout_seconds, 300, "Deadline of each call");
ABSL_FLAG(int32_t, connections, 1, "gRPC channels the streams are spread over");
ABSL_FLAG(std::string, auth_token, "", "Sent as 'authorization: Bearer <token>' when set");
ABSL_FLAG(std::string, json, "", "Also write the report as JSON to this file");
ABSL_FLAG(std::string, http, "",
          "HOST:PORT of the frontend's HTTP API: the streams go there (POST /v1/completions, "
          "stream: true, the same prompt and parameters) instead of gRPC; --target still "
          "answers GetModel. Each server-sent chunk counts as one token arrival");

namespace moe {
namespace {

struct Samples {
  std::vector<double> ttft, itl, e2e;
  int64_t tokens = 0, calls_ok = 0;
  int64_t calls_cut = 0;  // still running when the time was up: cancelled, not an error
  std::map<std::string, int64_t> errors;  // status code name -> count
};

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * (v.size() - 1) + 0.5));
  return v[i];
}

const char* CodeName(grpc::StatusCode code) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? kNames[i] : "?";
}

// One stream slot. `ctx` is the call in flight, so that the time limit can cancel it (an HTTP
// stream checks `stopped` on every chunk instead).
struct Slot {
  std::mutex mu;
  grpc::ClientContext* ctx = nullptr;
  bool stopped = false;
};

bool Stopped(Slot* slot) {
  std::lock_guard<std::mutex> lock(slot->mu);
  return slot->stopped;
}

// The same calls over the HTTP API: /v1/completions with the base request's prompt (token ids or
// text) and parameters, streamed. Tokens are the final usage chunk's completion_tokens; TTFT is
// the first text chunk; inter-token samples are the gaps between text chunks (one token each, as
// the frontend relays one message a step to a single stream).
void RunHttpSlot(const moe::v1::GenerateRequest& base, Slot* slot, Samples* out) {
  nlohmann::json body = {{"model", base.model()},
                         {"max_tokens", base.max_tokens()},
                         {"temperature", base.sampling().temperature()},
                         {"ignore_eos", base.stop().ignore_eos()},
                         {"stream", true},
                         {"stream_options", {{"include_usage", true}}}};
  if (base.has_token_ids()) {
    body["prompt"] = std::vector<uint32_t>(base.token_ids().ids().begin(), base.token_ids().ids().end());
  } else {
    body["prompt"] = base.text();
  }
  const std::string payload = body.dump();
  httplib::Client client("http://" + absl::GetFlag(FLAGS_http));
  client.set_read_timeout(static_cast<time_t>(absl::GetFlag(FLAGS_call_timeout_seconds)));
  httplib::Headers headers;
  if (!absl::GetFlag(FLAGS_auth_token).empty()) {
    headers.emplace("Authorization", "Bearer " + absl::GetFlag(FLAGS_auth_token));
  }
  while (!Stopped(slot)) {
    const double t0 = base::NowSeconds();
    double last = 0;
    int64_t chunks = 0, tokens = 0;
    std::string pending;  // bytes of an event not yet complete
    int status = 0;
    auto receive = [&](const char* data, size_t n) {
      pending.append(data, n);
      for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
        const std::string event = pending.substr(0, end);
        pending.erase(0, end + 2);
        if (event.rfind("data: {", 0) != 0) continue;
        const auto chunk = nlohmann::json::parse(event.substr(6), nullptr, false);
        if (chunk.is_discarded()) continue;
        if (chunk.contains("usage") && chunk["usage"].is_object()) {
          tokens = chunk["usage"].value("completion_tokens", int64_t{0});
        }
        if (!chunk.contains("choices") || chunk["choices"].empty()) continue;
        const double now = base::NowSeconds();
        if (chunks++ == 0) {
          out->ttft.push_back(now - t0);
        } else {
          out->itl.push_back(now - last);
        }
        last = now;
      }
      return !Stopped(slot);
    };
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.headers = headers;
    req.set_header("Content-Type", "application/json");
    req.body = payload;
    req.response_handler = [&](const httplib::Response& r) {
      status = r.status;
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      return receive(data, n);
    };
    const httplib::Result result = client.send(req);
    const bool stopped = Stopped(slot);
    if (result && status == 200 && tokens > 0) {
      out->tokens += tokens;
      out->calls_ok += 1;
      out->e2e.push_back(base::NowSeconds() - t0);
    } else if (stopped) {
      out->tokens += chunks;  // cut by the time limit before its usage chunk
      out->calls_cut += 1;
    } else {
      out->errors[result ? absl::StrCat("HTTP ", status) : httplib::to_string(result.error())] += 1;
    }
  }
}

// Issues calls back to back until the slot is stopped. Tokens, TTFT and inter-token samples of
// a call cut by the time limit still count; its end-to-end time does not.
void RunSlot(moe::v1::Inference::Stub& stub, const moe::v1::GenerateRequest& base, Slot* slot,
             Samples* out) {
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(
                         absl::GetFlag(FLAGS_call_timeout_seconds) * 1000)));
    if (!absl::GetFlag(FLAGS_auth_token).empty()) {
      ctx.AddMetadata("authorization", "Bearer " + absl::GetFlag(FLAGS_auth_token));
    }
    {
      std::lock_guard<std::mutex> lock(slot->mu);
      if (slot->stopped) return;
      slot->ctx = &ctx;
    }
    const double t0 = base::NowSeconds();
    double last = 0;
    int64_t tokens = 0;
    auto reader = stub.Generate(&ctx, base);
    moe::v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      const int k = msg.token_ids_size();
      if (k == 0) continue;
      const double now = base::NowSeconds();
      if (tokens == 0) {
        out->ttft.push_back(now - t0);
      } else {
        for (int i = 0; i < k; ++i) out->itl.push_back((now - last) / k);
      }
      last = now;
      tokens += k;
    }
    const grpc::Status status = reader->Finish();
    bool stopped = false;
    {
      std::lock_guard<std::mutex> lock(slot->mu);
      slot->ctx = nullptr;
      stopped = slot->stopped;
    }
    out->tokens += tokens;
    if (status.ok()) {
      out->calls_ok += 1;
      out->e2e.push_back(base::NowSeconds() - t0);
    } else if (stopped && status.error_code() == grpc::StatusCode::CANCELLED) {
      out->calls_cut += 1;
    } else {
      out->errors[CodeName(status.error_code())] += 1;
    }
  }
}

int Run() {
  std::vector<std::unique_ptr<moe::v1::Inference::Stub>> stubs;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_connections)); ++i) {
    grpc::ChannelArguments args;
    args.SetInt("moe.loadgen.channel", i);  // distinct args: distinct connections
    stubs.push_back(moe::v1::Inference::NewStub(grpc::CreateCustomChannel(
        absl::GetFlag(FLAGS_target), grpc::InsecureChannelCredentials(), args)));
  }
  moe::v1::GenerateRequest base;
  base.set_model(absl::GetFlag(FLAGS_model));
  if (!absl::GetFlag(FLAGS_text).empty()) {
    base.set_text(absl::GetFlag(FLAGS_text));
  } else {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!absl::GetFlag(FLAGS_auth_token).empty()) {
      ctx.AddMetadata("authorization", "Bearer " + absl::GetFlag(FLAGS_auth_token));
    }
    moe::v1::GetModelRequest req;
    req.set_model(absl::GetFlag(FLAGS_model));
    moe::v1::ModelInfo info;
    const grpc::Status st = stubs[0]->GetModel(&ctx, req, &info);
    if (!st.ok()) {
      std::fprintf(stderr, "moe-loadgen: GetModel: %s\n", st.error_message().c_str());
      return 1;
    }
    std::mt19937 rng(7);
    std::uniform_int_distribution<uint32_t> id(0, static_cast<uint32_t>(info.vocab_size() - 1));
    for (int i = 0; i < absl::GetFlag(FLAGS_prompt_tokens); ++i) {
      base.mutable_token_ids()->add_ids(id(rng));
    }
  }
  base.set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
  base.mutable_sampling()->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  base.mutable_stop()->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));

  const int n = std::max(1, absl::GetFlag(FLAGS_concurrency));
  std::vector<Samples> samples(n);
  std::vector<Slot> slots(n);
  const double start = base::NowSeconds();
  std::vector<std::thread> threads;
  const bool http = !absl::GetFlag(FLAGS_http).empty();
  for (int i = 0; i < n; ++i) {
    if (http) {
      threads.emplace_back(RunHttpSlot, std::cref(base), &slots[i], &samples[i]);
    } else {
      threads.emplace_back(RunSlot, std::ref(*stubs[i % stubs.size()]), std::cref(base),
                           &slots[i], &samples[i]);
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(
      static_cast<int64_t>(absl::GetFlag(FLAGS_duration_seconds) * 1000)));
  // Time is up: no new calls, and the ones in flight are cut. The rates are over the time until
  // now: a cut call's connection closing (an HTTP stream notices at its next chunk) is not work.
  const double elapsed = base::NowSeconds() - start;
  for (Slot& slot : slots) {
    std::lock_guard<std::mutex> lock(slot.mu);
    slot.stopped = true;
    if (slot.ctx != nullptr) slot.ctx->TryCancel();
  }
  for (auto& t : threads) t.join();

  Samples all;
  for (Samples& s : samples) {
    all.ttft.insert(all.ttft.end(), s.ttft.begin(), s.ttft.end());
    all.itl.insert(all.itl.end(), s.itl.begin(), s.itl.end());
    all.e2e.insert(all.e2e.end(), s.e2e.begin(), s.e2e.end());
    all.tokens += s.tokens;
    all.calls_ok += s.calls_ok;
    all.calls_cut += s.calls_cut;
    for (const auto& [code, count] : s.errors) all.errors[code] += count;
  }
  std::vector<std::string> errors;
  int64_t error_count = 0;
  for (const auto& [code, count] : all.errors) {
    errors.push_back(absl::StrCat("\"", code, "\": ", count));
    error_count += count;
  }
  const std::string report =
      absl::StrCat("{\"concurrency\": ", n, ", \"seconds\": ", elapsed,
                   ", \"calls_ok\": ", all.calls_ok, ", \"errors\": {", absl::StrJoin(errors, ", "),
                   "}, \"tokens\": ", all.tokens, ", \"tokens_per_second\": ", all.tokens / elapsed,
                   ", \"calls_per_second\": ", all.calls_ok / elapsed,
                   ", \"ttft_seconds\": {\"p50\": ", Percentile(all.ttft, 50),
                   ", \"p90\": ", Percentile(all.ttft, 90), ", \"p99\": ", Percentile(all.ttft, 99),
                   "}", ", \"itl_seconds\": {\"p50\": ", Percentile(all.itl, 50),
                   ", \"p90\": ", Percentile(all.itl, 90), ", \"p99\": ", Percentile(all.itl, 99),
                   "}", ", \"e2e_seconds\": {\"p50\": ", Percentile(all.e2e, 50),
                   ", \"p99\": ", Percentile(all.e2e, 99), "}}");
  std::printf(
      "streams %d for %.1f s: %lld calls ok, %lld cut at the end, %lld errors, %lld tokens\n"
      "throughput %.1f tokens/s, %.2f calls/s\n"
      "TTFT  p50 %.2f ms  p90 %.2f ms  p99 %.2f ms\n"
      "ITL   p50 %.2f ms  p90 %.2f ms  p99 %.2f ms\n",
      n, elapsed, static_cast<long long>(all.calls_ok), static_cast<long long>(all.calls_cut),
      static_cast<long long>(error_count),
      static_cast<long long>(all.tokens), all.tokens / elapsed, all.calls_ok / elapsed,
      Percentile(all.ttft, 50) * 1e3, Percentile(all.ttft, 90) * 1e3,
      Percentile(all.ttft, 99) * 1e3, Percentile(all.itl, 50) * 1e3, Percentile(all.itl, 90) * 1e3,
      Percentile(all.itl, 99) * 1e3);
  for (const auto& [code, count] : all.errors) {
    std::printf("errors %s: %lld\n", code.c_str(), static_cast<long long>(count));
  }
  if (!absl::GetFlag(FLAGS_json).empty()) {
    FILE* f = std::fopen(absl::GetFlag(FLAGS_json).c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "moe-loadgen: cannot write %s\n", absl::GetFlag(FLAGS_json).c_str());
      return 1;
    }
    std::fprintf(f, "%s\n", report.c_str());
    std::fclose(f);
  }
  return error_count == 0 ? 0 : 2;
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  moe::base::ParseFlags(argc, argv,
      "Holds N concurrent Generate streams for T seconds and reports throughput, TTFT and "
      "inter-token latency.\n"
      "  moe-loadgen --target=127.0.0.1:50051 --model=default --concurrency=32 "
      "--duration_seconds=60\n"
      "  moe-loadgen --target=127.0.0.1:50051 --http=127.0.0.1:8080 ...   (the HTTP API)",
      __FILE__);
  return moe::Run();
}
