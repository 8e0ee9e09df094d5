// The GPU's own timeline of every kernel a program runs, with launches overlapped as they are in
// production (programmatic dependent launch, several streams): what ncu cannot show, since it
// serialises kernels and flushes caches around each.
//
//   LD_PRELOAD=bundle/lib/libmoe_timeline.so MOE_TIMELINE_OUT=k.csv bundle/bin/moe-bench ...
//   tests/bench/timeline_report.py k.csv
//
// CUPTI's concurrent-kernel activity records (which do not serialise kernels), and with
// MOE_TIMELINE_COPIES=1 its memory copy records, are collected from load to exit and written as
// CSV: start_ns,end_ns,stream,grid,block,name (demangled; a copy is "memcpy <kind> <bytes>", grid
// and block 0). Kernels alone cost ~1% of batch-1 decode; copies cost the expert store's decode
// path a quarter of its speed (it copies and waits every layer): read its figures as a shape.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct KernelRecord {
  uint64_t start, end;
  uint32_t stream;
  uint32_t grid, block;  // total blocks, threads a block
  std::string name;
};

std::mutex records_mutex;
std::vector<KernelRecord>* records = nullptr;  // leaked on purpose: read by the atexit handler

constexpr size_t kBufferBytes = 8 << 20;

void Check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  cuptiGetResultString(r, &text);
  std::fprintf(stderr, "kernel_timeline: %s failed: %s\n", what, text ? text : "?");
}

std::string Demangle(const char* name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d != nullptr ? d : name;
  std::free(d);
  for (char& c : s) {
    if (c == ',') c = ';';  // one CSV field
  }
  return s;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::vector<KernelRecord> batch;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      const char* kind = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "HtoD"
                         : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "DtoH"
                                                                           : "other";
      batch.push_back({m->start, m->end, m->streamId, 0, 0,
                       std::string("memcpy ") + kind + " " + std::to_string(m->bytes)});
      continue;
    }
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    const auto grid = static_cast<uint32_t>(k->gridX) * k->gridY * k->gridZ;
    const auto block = static_cast<uint32_t>(k->blockX) * k->blockY * k->blockZ;
    batch.push_back({k->start, k->end, k->streamId, grid, block, Demangle(k->name)});
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(records_mutex);
  records->insert(records->end(), batch.begin(), batch.end());
}

void WriteOnExit() {
  Check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  const char* path = std::getenv("MOE_TIMELINE_OUT");
  FILE* f = std::fopen(path != nullptr ? path : "kernel_timeline.csv", "w");
  if (f == nullptr) {
    std::perror("kernel_timeline: cannot write the timeline");
    return;
  }
  std::lock_guard<std::mutex> lock(records_mutex);
  std::fprintf(f, "start_ns,end_ns,stream,grid,block,name\n");
  for (const KernelRecord& r : *records) {
    std::fprintf(f, "%llu,%llu,%u,%u,%u,%s\n", static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.stream, r.grid, r.block,
                 r.name.c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "kernel_timeline: %zu kernels and copies\n", records->size());
}

[[gnu::constructor]] void Start() {
  records = new std::vector<KernelRecord>();
  Check(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted),
        "cuptiActivityRegisterCallbacks");
  Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  const char* copies = std::getenv("MOE_TIMELINE_COPIES");
  if (copies != nullptr && std::strcmp(copies, "1") == 0) {
    Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "cuptiActivityEnable");
  }
  std::atexit(WriteOnExit);
}

}  // namespace
