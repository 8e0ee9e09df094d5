// Routing trace reading/writing and the synthetic generator (Zipf + temporal locality).
#include "expertstore/routing_trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace moe::store {

absl::StatusOr<RoutingTrace> ReadRoutingTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("routing trace ", path, ": cannot open"));
  RoutingTrace trace;
  std::string line, magic;
  int version = 0;
  int64_t line_no = 0;
  bool header = false;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    const std::string where = absl::StrCat("routing trace ", path, ":", line_no);
    if (!header) {
      if (!(fields >> magic >> version >> trace.num_layers >> trace.num_experts) ||
          magic != "moe-routing-trace" || (version != 1 && version != 2) ||
          trace.num_layers <= 0 || trace.num_experts <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": expected 'moe-routing-trace 2 <layers> <experts>'"));
      }
      header = true;
      continue;
    }
    RoutingRecord r;
    if (version >= 2 && line[0] == 'p') {
      r.prediction = true;
      fields.get();
    }
    if (!(fields >> r.step >> r.layer)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": expected '<step> <layer> ...'"));
    }
    if (r.layer < 0 || r.layer >= trace.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": layer ", r.layer, " out of range"));
    }
    if (!trace.records.empty() && r.step < trace.records.back().step) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": step ", r.step, " goes backwards"));
    }
    int32_t e;
    while (fields >> e) {
      if (e < 0 || e >= trace.num_experts) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": expert ", e, " out of range"));
      }
      r.experts.push_back(e);
    }
    if (!fields.eof()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a list of expert ids"));
    }
    trace.records.push_back(std::move(r));
  }
  if (!header) return absl::InvalidArgumentError(absl::StrCat("routing trace ", path, ": empty"));
  return trace;
}

absl::Status WriteRoutingTrace(const std::string& path, const RoutingTrace& trace) {
  std::ofstream out(path);
  out << "moe-routing-trace 2 " << trace.num_layers << " " << trace.num_experts << "\n";
  for (const RoutingRecord& r : trace.records) {
    out << (r.prediction ? "p " : "") << r.step << " " << r.layer;
    for (int32_t e : r.experts) out << " " << e;
    out << "\n";
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("routing trace ", path, ": write failed"));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RoutingTraceWriter>> RoutingTraceWriter::Create(
    const std::string& path, int32_t num_layers, int32_t num_experts) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return absl::InternalError(absl::StrCat("routing trace ", path, ": cannot create"));
  }
  std::fprintf(f, "moe-routing-trace 2 %d %d\n", num_layers, num_experts);
  return std::unique_ptr<RoutingTraceWriter>(new RoutingTraceWriter(path, f));
}

RoutingTraceWriter::~RoutingTraceWriter() { std::fclose(file_); }

void RoutingTraceWriter::Append(int64_t step, int32_t layer, const std::vector<int32_t>& experts) {
  std::fprintf(file_, "%lld %d", static_cast<long long>(step), layer);
  for (int32_t e : experts) std::fprintf(file_, " %d", e);
  std::fputc('\n', file_);
}

void RoutingTraceWriter::AppendPrediction(int64_t step, int32_t layer,
                                          const std::vector<int32_t>& experts) {
  std::fputs("p ", file_);
  Append(step, layer, experts);
}

absl::Status RoutingTraceWriter::Flush() {
  if (std::fflush(file_) != 0 || std::ferror(file_)) {
    std::clearerr(file_);
    return absl::InternalError(absl::StrCat("routing trace ", path_, ": write failed"));
  }
  return absl::OkStatus();
}

std::vector<ExpertId> TraceAccesses(const RoutingTrace& trace) {
  std::vector<ExpertId> out;
  for (const RoutingRecord& r : trace.records) {
    if (r.prediction) continue;
    for (int32_t e : r.experts) out.push_back(ExpertId{r.layer, e});
  }
  return out;
}

absl::StatusOr<RoutingTrace> MakeSyntheticTrace(const SyntheticTraceOptions& o) {
  if (o.num_layers <= 0 || o.num_experts <= 0 || o.steps < 0) {
    return absl::InvalidArgumentError(
        "synthetic trace: layers, experts and steps must be positive");
  }
  if (o.top_k <= 0 || o.top_k > o.num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic trace: top_k ", o.top_k, " outside [1, ", o.num_experts, "]"));
  }
  if (!(o.locality >= 0 && o.locality <= 1) || !(o.zipf_s >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic trace: locality ", o.locality,
                                                   " or zipf_s ", o.zipf_s, " out of range"));
  }
  std::mt19937_64 rng(o.seed);
  std::vector<double> weights(o.num_experts);
  for (int32_t r = 0; r < o.num_experts; ++r) weights[r] = 1.0 / std::pow(r + 1.0, o.zipf_s);
  std::discrete_distribution<int32_t> zipf(weights.begin(), weights.end());
  std::uniform_real_distribution<double> coin(0, 1);
  // Each layer ranks its experts differently, as real routers do.
  std::vector<std::vector<int32_t>> rank_to_expert(o.num_layers);
  for (auto& perm : rank_to_expert) {
    perm.resize(o.num_experts);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
  }
  RoutingTrace trace{o.num_layers, o.num_experts, {}};
  std::vector<std::vector<int32_t>> previous(o.num_layers);
  for (int64_t step = 0; step < o.steps; ++step) {
    for (int32_t layer = 0; layer < o.num_layers; ++layer) {
      RoutingRecord r{step, layer, {}};
      while (static_cast<int32_t>(r.experts.size()) < o.top_k) {
        int32_t e;
        if (!previous[layer].empty() && coin(rng) < o.locality) {
          e = previous[layer][rng() % previous[layer].size()];
        } else {
          e = rank_to_expert[layer][zipf(rng)];
        }
        if (std::find(r.experts.begin(), r.experts.end(), e) == r.experts.end()) {
          r.experts.push_back(e);
        }
      }
      previous[layer] = r.experts;
      trace.records.push_back(std::move(r));
    }
  }
  return trace;
}

}  // namespace moe::store
