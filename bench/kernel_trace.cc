#include "bench/kernel_trace.h"

#include <cupti.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <vector>

namespace oomb {
namespace {

struct Row {
  const char* kind;
  uint64_t start, end;
  uint32_t stream;
  int64_t grid, block, bytes;
  std::string name;
};

std::mutex rows_mu;
std::vector<Row> rows;  // guarded by rows_mu: what CUPTI's completed buffers held

constexpr size_t kBufferBytes = size_t{16} << 20;

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

const char* CopyKindName(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "DtoD";
    default:
      return "other";
  }
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<Row> got;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      got.push_back({"kernel", k->start, k->end, k->streamId, int64_t{k->gridX} * k->gridY * k->gridZ,
                     int64_t{k->blockX} * k->blockY * k->blockZ, 0, k->name != nullptr ? k->name : "?"});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      got.push_back(
          {"memcpy", c->start, c->end, c->streamId, 0, 0, static_cast<int64_t>(c->bytes), CopyKindName(c->copyKind)});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      got.push_back({"memset", m->start, m->end, m->streamId, 0, 0, static_cast<int64_t>(m->bytes), "memset"});
    }
  }
  std::free(buffer);
  const std::lock_guard<std::mutex> lock(rows_mu);
  rows.insert(rows.end(), std::make_move_iterator(got.begin()), std::make_move_iterator(got.end()));
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

bool Check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::cerr << "kernel trace: " << what << ": " << (msg != nullptr ? msg : "?") << std::endl;
  return false;
}

// Records for `duration_s`, then flushes every record into `rows`.
void Record(double delay_s, double duration_s) {
  std::this_thread::sleep_for(std::chrono::duration<double>(delay_s));
  for (const CUpti_ActivityKind kind : kKinds) {
    if (!Check(cuptiActivityEnable(kind), "enable")) return;
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(duration_s));
  for (const CUpti_ActivityKind kind : kKinds) Check(cuptiActivityDisable(kind), "disable");
  Check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flush");
}

}  // namespace

bool KernelTrace::Initialize() {
  return Check(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted), "register");
}

KernelTrace::KernelTrace(std::string path, double delay_s, double duration_s)
    : path_(std::move(path)), thread_(Record, delay_s, duration_s) {}

KernelTrace::~KernelTrace() {
  thread_.join();
  std::vector<Row> got;
  {
    const std::lock_guard<std::mutex> lock(rows_mu);
    got.swap(rows);
  }
  std::sort(got.begin(), got.end(), [](const Row& a, const Row& b) { return a.start < b.start; });
  std::ofstream out(path_);
  out << "kind\tstart_ns\tend_ns\tstream\tgrid\tblock\tbytes\tname\n";
  const uint64_t t0 = got.empty() ? 0 : got.front().start;
  for (const Row& r : got) {
    out << r.kind << '\t' << r.start - t0 << '\t' << r.end - t0 << '\t' << r.stream << '\t' << r.grid << '\t' << r.block
        << '\t' << r.bytes << '\t' << r.name << '\n';
  }
  std::cerr << "kernel trace: " << got.size() << " records in " << path_ << std::endl;
}

}  // namespace oomb
