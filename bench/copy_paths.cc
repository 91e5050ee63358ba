// How a batch of scattered KV pages best moves between pinned host memory and the GPU: the
// copy engine's two ways, measured alone and beside a bf16 matmul on another stream (the
// trainer's compute, which the copies are meant to overlap).
//
//   dma:       one cudaMemcpyAsync per run of adjacent pages (the copy engine's first way)
//   dma batch: one cudaMemcpyBatchAsync of every run (CUDA 12.8+: the driver's copy engines,
//              no SMs, one API call)
//   kernel B:  one launch of kernels/page_copy.h LaunchCopyRuns on B thread blocks, its threads
//              reading (or writing) the host pages through unified addressing
//
// A batch is `--select` pages drawn at random from `--pages` pinned host pages of `--page-bytes`
// (Qwen2.5-7B's bf16 page: 2 x 4 KV heads x 128 tokens x 128 dims x 2 bytes = 256 KiB), sorted
// and merged into runs as the copy engine does. Prints one JSON line per (direction, way):
// GB/s alone, the host time to issue a batch, and, with the matmul running: the copy's GB/s and
// the matmul's TFLOP/s against the matmul alone.
//
// --heads K: of each page only the K and V of K of its 4 KV heads (runs of 32 KiB).
// --high-priority: the copies on a high-priority stream (as the copy engine's fetches).
//
// Usage: bench_copy_paths [--pages 8192] [--select 600] [--blocks 8 16 32 64] [--iters 20] [--heads 1]
//                         [--high-priority]
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/page_copy.h"

namespace oomb {
namespace {

struct Batch {
  std::vector<kernels::CopyRunDesc> runs;
  at::Tensor device_runs;  // the runs cut into the kernel's descriptors (kernels::CopySegments)
  int64_t segments = 0;
  int64_t bytes = 0;
};

// The runs of a batch of `pages`: whole pages, or (heads > 0) the K and V of the first `heads`
// of a page's 4 KV heads (what the sparse cache fetches of a page some heads selected).
Batch MakeBatch(const at::Tensor& host, const at::Tensor& images, const std::vector<int64_t>& pages, bool to_device,
                int64_t heads) {
  const int64_t page_bytes = host.size(1), kv_heads = 4, head_bytes = page_bytes / (2 * kv_heads);
  Batch b;
  auto add = [&](char* h, char* d, int64_t bytes) {
    const char* last_h =
        b.runs.empty() ? nullptr : static_cast<const char*>(to_device ? b.runs.back().src : b.runs.back().dst);
    if (last_h != nullptr && last_h + b.runs.back().bytes == h) {
      b.runs.back().bytes += bytes;
    } else {
      b.runs.push_back(to_device ? kernels::CopyRunDesc{h, d, bytes} : kernels::CopyRunDesc{d, h, bytes});
    }
    b.bytes += bytes;
  };
  for (size_t i = 0; i < pages.size(); ++i) {
    char* h = static_cast<char*>(host.data_ptr()) + pages[i] * page_bytes;
    char* d = static_cast<char*>(images.data_ptr()) + static_cast<int64_t>(i) * page_bytes;
    if (heads == 0) {
      add(h, d, page_bytes);
      continue;
    }
    for (int64_t kv = 0; kv < 2; ++kv) {
      for (int64_t head = 0; head < heads; ++head) {
        const int64_t offset = (kv * kv_heads + head) * head_bytes;
        add(h + offset, d + offset, head_bytes);
      }
    }
  }
  std::vector<kernels::CopyRunDesc> segments = kernels::CopySegments(b.runs);
  b.segments = static_cast<int64_t>(segments.size());
  const int64_t n = static_cast<int64_t>(segments.size() * sizeof(kernels::CopyRunDesc));
  b.device_runs = at::from_blob(segments.data(), {n}, at::kByte).to(images.device());
  return b;
}

// The ways a batch moves: kDmaPerRun, kDmaBatch, or a number of thread blocks for the kernel.
constexpr int kDmaPerRun = 0;
constexpr int kDmaBatch = -1;

// Queues one batch on `stream` the way `way` says.
void Queue(const Batch& b, int way, bool to_device, cudaStream_t stream) {
  if (way == kDmaBatch) {
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    for (const kernels::CopyRunDesc& r : b.runs) {
      dsts.push_back(r.dst);
      srcs.push_back(r.src);
      sizes.push_back(static_cast<size_t>(r.bytes));
    }
    cudaMemcpyAttributes attrs{};
    attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attrs.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t first = 0;
    C10_CUDA_CHECK(
        cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attrs, &first, 1, stream));
    return;
  }
  if (way == kDmaPerRun) {
    for (const kernels::CopyRunDesc& r : b.runs) {
      C10_CUDA_CHECK(
          cudaMemcpyAsync(r.dst, r.src, r.bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream));
    }
    return;
  }
  C10_CUDA_CHECK(kernels::LaunchCopyRuns(static_cast<const kernels::CopyRunDesc*>(b.device_runs.data_ptr()), b.segments,
                                         way, stream));
}

double Seconds(at::cuda::CUDAEvent& start, at::cuda::CUDAEvent& end) {
  end.synchronize();
  return start.elapsed_time(end) / 1000.0;
}

}  // namespace
}  // namespace oomb

int main(int argc, char** argv) {
  using namespace oomb;
  CLI::App app{"bench_copy_paths: scattered page copies, per-run or batched DMA against one kernel"};
  int64_t pages = 8192, select = 600, page_bytes = 262144, iters = 20, matmul = 8192, heads = 0;
  std::vector<int> blocks = {8, 16, 32, 64};
  app.add_option("--pages", pages, "pinned host pages");
  app.add_option("--select", select, "pages in a batch");
  app.add_option("--page-bytes", page_bytes, "bytes of a page");
  app.add_option("--blocks", blocks, "thread blocks of the kernel ways");
  app.add_option("--iters", iters, "batches per measurement");
  app.add_option("--matmul", matmul, "the side of the square bf16 matmul run beside the copies");
  app.add_option("--heads", heads, "KV heads of a page to copy (of 4; 0: whole pages)")->check(CLI::Range(0, 4));
  bool high_priority = false;
  app.add_flag("--high-priority", high_priority, "copies on a high-priority stream");
  CLI11_PARSE(app, argc, argv);

  const at::Device dev(at::kCUDA, 0);
  const c10::cuda::CUDAGuard guard(dev);
  const at::Tensor host = at::empty({pages, page_bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  host.fill_(1);
  const at::Tensor images = at::zeros({select, page_bytes}, at::TensorOptions().dtype(at::kByte).device(dev));
  std::vector<int64_t> all(pages);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), std::mt19937(7));
  std::vector<int64_t> chosen(all.begin(), all.begin() + select);
  std::sort(chosen.begin(), chosen.end());

  const at::Tensor a = at::randn({matmul, matmul}, at::TensorOptions().dtype(at::kBFloat16).device(dev));
  const at::Tensor bm = at::randn({matmul, matmul}, a.options());
  const c10::cuda::CUDAStream compute = c10::cuda::getStreamFromPool(false, 0);
  const c10::cuda::CUDAStream copies = c10::cuda::getStreamFromPool(high_priority, 0);
  const double flops = 2.0 * matmul * matmul * matmul;
  // `reps` matmuls on the compute stream; seconds per matmul.
  auto run_matmuls = [&](int64_t reps, at::cuda::CUDAEvent& start, at::cuda::CUDAEvent& end) {
    const c10::cuda::CUDAStreamGuard sg(compute);
    start.record(compute);
    for (int64_t i = 0; i < reps; ++i) at::matmul(a, bm);
    end.record(compute);
  };
  {
    at::cuda::CUDAEvent s(cudaEventDefault), e(cudaEventDefault);
    run_matmuls(5, s, e);  // warm-up
    Seconds(s, e);
  }
  double matmul_alone = 0;
  {
    at::cuda::CUDAEvent s(cudaEventDefault), e(cudaEventDefault);
    run_matmuls(50, s, e);
    matmul_alone = Seconds(s, e) / 50;
  }
  std::cout << nlohmann::json{{"matmul", matmul}, {"matmul_tflops_alone", flops / matmul_alone / 1e12}}.dump()
            << std::endl;

  for (const bool to_device : {true, false}) {
    const Batch batch = MakeBatch(host, images, chosen, to_device, heads);
    std::vector<int> ways = {kDmaPerRun, kDmaBatch};
    ways.insert(ways.end(), blocks.begin(), blocks.end());
    for (const int way : ways) {
      Queue(batch, way, to_device, copies);  // warm-up
      copies.synchronize();
      // Alone.
      at::cuda::CUDAEvent s(cudaEventDefault), e(cudaEventDefault);
      const auto t0 = std::chrono::steady_clock::now();
      s.record(copies);
      for (int64_t i = 0; i < iters; ++i) Queue(batch, way, to_device, copies);
      e.record(copies);
      const double issue = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
      const double alone = Seconds(s, e) / iters;
      // Beside the matmuls: enough batches to outlast them.
      const int64_t reps = 40, batches = std::max<int64_t>(1, static_cast<int64_t>(reps * matmul_alone / alone));
      at::cuda::CUDAEvent ms(cudaEventDefault), me(cudaEventDefault), cs(cudaEventDefault), ce(cudaEventDefault);
      cs.record(copies);
      for (int64_t i = 0; i < batches; ++i) Queue(batch, way, to_device, copies);
      ce.record(copies);
      run_matmuls(reps, ms, me);
      const double with_matmul = Seconds(ms, me) / reps;
      const double copy_beside = Seconds(cs, ce) / batches;
      std::cout << nlohmann::json{{"direction", to_device ? "h2d" : "d2h"},
                                  {"way", way == kDmaPerRun  ? std::string("dma")
                                          : way == kDmaBatch ? std::string("dma batch")
                                                             : "kernel " + std::to_string(way)},
                                  {"pages", select},
                                  {"heads", heads},
                                  {"high_priority", high_priority},
                                  {"runs", batch.runs.size()},
                                  {"batch_bytes", batch.bytes},
                                  {"gbps_alone", batch.bytes / alone / 1e9},
                                  {"issue_us", issue * 1e6},
                                  {"gbps_beside_matmul", batch.bytes / copy_beside / 1e9},
                                  {"matmul_tflops_beside", flops / with_matmul / 1e12},
                                  {"matmul_slowdown", with_matmul / matmul_alone}}
                       .dump()
                << std::endl;
    }
  }
  return 0;
}
