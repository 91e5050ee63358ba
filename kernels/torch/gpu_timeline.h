// Opt-in attribution of a training step's GPU time to named sections, for benchmarks
// (bench_train --sections). Off unless enabled; costs one flag test per mark when off.
//
// Mark(name) records an event on the current CUDA stream. The GPU time from one mark to the
// next goes to the earlier mark's name, including the time the GPU sat idle waiting for the
// host (a blocking copy, a launch-bound stretch): the sections partition the timeline, so they
// add up to the step. Marks on the CPU are ignored. Each device has its own timeline (the calling
// thread's current device), so ranks on several devices (tensor parallelism, one thread a rank)
// each Enable, Stage, Mark and Collect their own, the autograd engine's thread of a device
// marking into that device's.
//
//   timeline::Enable(true);
//   timeline::Mark("model");   ...   timeline::Mark("sparse.gather");   ...
//   std::map<std::string, double> seconds = timeline::Collect();  // waits for the GPU
#ifndef OOMB_KERNELS_TORCH_GPU_TIMELINE_H_
#define OOMB_KERNELS_TORCH_GPU_TIMELINE_H_

#include <map>
#include <string>

namespace oomb::kernels::timeline {

// Turns marking on or off on the current device (either way drops its marks not collected).
void Enable(bool on);

// Starts section `name` (a string literal: kept by pointer) on the current CUDA stream.
void Mark(const char* name);

// Names the stage (a string literal, or null for none) that the following marks fall in: the
// trainer's "stage1" and "stage2".
void Stage(const char* stage);

// Closes the current device's last section, waits for it, and returns the seconds of each section name summed
// over the marks since the last Collect (or Enable), and of each section marked in a stage
// as "<stage>/<name>" too; then starts over. `host_seconds`, when given, gets the same for the
// host's wall clock between the marks (the last section ends at this call): where the host
// spends about as long as the GPU, the host sets the pace; where much longer, it waited.
std::map<std::string, double> Collect(std::map<std::string, double>* host_seconds = nullptr);

}  // namespace oomb::kernels::timeline

#endif  // OOMB_KERNELS_TORCH_GPU_TIMELINE_H_
