// What the KV tests share: a page shape, the two places the "device" tier can be, seeded
// random tensors, an exact (or tolerant) comparison, and tiered pools.
#ifndef OOMB_TESTS_WORKER_KV_KV_TESTING_H_
#define OOMB_TESTS_WORKER_KV_KV_TESTING_H_

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/kv/kv_pools.h"

namespace oomb::testing {

inline const PageShape kShape{2, 4, 8};  // kv_heads, page_tokens, head_dim

// Where the "device" tier is and its dtypes: the CPU in float64, or a GPU (pinned host pools)
// in float32, the dtype the CUDA gradient accumulation takes.
struct Target {
  at::Device device;
  at::ScalarType dtype;
};
inline const Target kCpu{at::Device(at::kCPU), at::kDouble};
inline const Target kCuda{at::Device(at::kCUDA, 0), at::kFloat};

inline at::Tensor Random(std::vector<int64_t> sizes, uint64_t seed, const Target& t = kCpu) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn(sizes, gen, at::TensorOptions().dtype(at::kDouble)).to(t.device, t.dtype);
}

// Bit for bit, or (tolerance > 0) within tolerance of the largest magnitude of `want`.
inline void ExpectSame(const at::Tensor& got, const at::Tensor& want, const std::string& what, double tolerance = 0) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double diff = (got - want).abs().max().item<double>();
  if (tolerance == 0) {
    EXPECT_TRUE(at::equal(got, want)) << what << ": max difference " << diff;
  } else {
    EXPECT_LE(diff, tolerance * want.abs().max().item<double>()) << what;
  }
}

// Pools whose device tier holds `device_pages` pages and whose host tier (slabs of 5 pages, so a
// sequence spans several) holds `host_pages`; `grad_dtype`: the gradient pages' storage
// (Undefined: the target's dtype).
inline OwnedKvPools MakeTiers(int64_t device_pages, int64_t host_pages, const Target& target = kCpu,
                              at::ScalarType grad_dtype = at::ScalarType::Undefined) {
  if (grad_dtype == at::ScalarType::Undefined) grad_dtype = target.dtype;
  auto pools =
      MakeKvPools(kShape, target.dtype, grad_dtype, target.device, KvPoolSizes::Pairs(device_pages, host_pages),
                  /*host_slab_bytes=*/5 * kShape.elems() * 8);
  EXPECT_TRUE(pools.ok()) << pools.status();
  return *std::move(pools);
}

// The value of an operation that must succeed: a failure throws, which fails the test.
template <typename T>
T Ok(absl::StatusOr<T> v) {
  if (!v.ok()) throw std::runtime_error(v.status().ToString());
  return *std::move(v);
}

}  // namespace oomb::testing

#endif  // OOMB_TESTS_WORKER_KV_KV_TESTING_H_
