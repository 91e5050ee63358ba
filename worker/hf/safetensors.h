// Reading and writing the safetensors format (https://github.com/huggingface/safetensors):
//
//   [u64 little-endian N][N bytes of JSON header][data section]
//
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} with
// offsets relative to the start of the data section; the optional key "__metadata__" holds a
// string-to-string map.
//
// SafetensorsFile maps one file read-only and validates the whole header up front, so that a
// TensorView it hands out always points at `nbytes` readable bytes. WeightSet opens a Hugging
// Face model directory (one file, or an index plus shards). WriteSafetensors writes files that
// are byte-identical to those of the Python `safetensors` package for the same tensors and
// metadata.
//
// Errors: a missing file is NOT_FOUND; anything malformed is INVALID_ARGUMENT with a message
// that names the file and, where one is involved, the tensor. Nothing here asserts on file
// contents.
#ifndef OOMB_WORKER_HF_SAFETENSORS_H_
#define OOMB_WORKER_HF_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/common/file_access.h"

namespace oomb {

// The element types oomb reads and writes. Others (F8_*, U16, U32, U64, C64, ...) are rejected
// as unknown when a file is opened.
enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// Bytes per element: 8, 4, 2, 2, 8, 4, 2, 1, 1, 1.
size_t DTypeSize(DType dtype);

// The safetensors spelling: "F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL".
std::string_view DTypeName(DType dtype);

// Inverse of DTypeName (exact, case-sensitive). INVALID_ARGUMENT naming `name` otherwise.
absl::StatusOr<DType> ParseDType(std::string_view name);

// A tensor's description plus a pointer to its bytes (row-major, little-endian). A view does
// not own its data: views from a SafetensorsFile live as long as the file object; views
// passed to WriteSafetensors are only read during the call.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // empty for a scalar
  const void* data = nullptr;
  size_t nbytes = 0;  // == product(shape) * DTypeSize(dtype)
};

// Number of elements of `shape` (1 for a scalar), or -1 when it overflows int64 or a dimension
// is negative.
int64_t NumElements(const std::vector<int64_t>& shape);

// One safetensors file, memory-mapped read-only. Non-copyable, non-movable (views point into
// the mapping); hold it by unique_ptr. Thread-safe: every method is const after Open.
class SafetensorsFile {
 public:
  // Maps and validates `file`:
  //   - the file has at least 8 bytes; the header length N satisfies 8 + N <= file size and
  //     N <= 100 MB; the header is a JSON object without duplicate keys;
  //   - each tensor entry has a known "dtype", a "shape" of non-negative integers, and
  //     "data_offsets" [begin, end] with begin <= end <= size of the data section and
  //     end - begin == product(shape) * DTypeSize(dtype);
  //   - the byte ranges of different tensors do not overlap (gaps are tolerated);
  //   - "__metadata__", when present, is an object of strings.
  // INVALID_ARGUMENT for everything else, including I/O errors while mapping (messages name the
  // path and, where relevant, the tensor). The mapping outlives `file`'s descriptor.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const File& file);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }

  // Every tensor, in increasing order of data offset (the order of the data section).
  const std::vector<TensorView>& tensors() const { return tensors_; }

  // The tensor called `name`, or nullptr.
  const TensorView* Find(std::string_view name) const;

  // The "__metadata__" map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;

  std::string path_;
  void* map_ = nullptr;  // the whole file, PROT_READ
  size_t map_size_ = 0;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// The weights of a Hugging Face model directory: one safetensors file or a sharded set.
// Non-copyable; views stay valid as long as the WeightSet. Thread-safe after Open.
class WeightSet {
 public:
  // Opens the weights in `dir`. With `file_name` empty: "model.safetensors" if it exists, else
  // "model.safetensors.index.json" plus the shards it names. With `file_name` set (for example
  // "adapter_model.safetensors" of a PEFT adapter, or an index file ending in ".json"): that
  // file only.
  //
  // An index must be a JSON object whose "weight_map" is an object of tensor name -> shard file
  // name (a plain file name in `dir`). Each named shard must exist (NOT_FOUND, naming the
  // shard, the index and one tensor mapped to it) and contain every tensor mapped to it; no
  // tensor may appear in two shards (INVALID_ARGUMENT naming both). Shards are opened and
  // validated as by SafetensorsFile::Open. NOT_FOUND when `dir` has no weights.
  static absl::StatusOr<std::unique_ptr<WeightSet>> Open(const Dir& dir, const std::string& file_name = "");

  WeightSet(const WeightSet&) = delete;
  WeightSet& operator=(const WeightSet&) = delete;

  // The tensor called `name` (in whichever shard holds it), or nullptr.
  const TensorView* Find(std::string_view name) const;

  // All tensor names, sorted.
  std::vector<std::string> names() const;

  // The opened files (one unless sharded), in the index's shard order (sorted by name).
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  WeightSet() = default;

  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*, std::less<>> by_name_;
};

// Writes `tensors` and `metadata` to the file `name` in `dir`, in the layout the Python `safetensors` package
// produces: compact JSON header with "__metadata__" first (keys sorted), then tensors in data
// order; data order is by dtype (I64, F64, F32, I32, BF16, F16, I16, I8, U8, BOOL), then by
// name; the header is padded with spaces so the data section starts at a multiple of 8.
// The write is atomic (temporary file in the same directory, fsync, rename, directory fsync)
// and streams tensor data without copying it.
//
// INVALID_ARGUMENT for duplicate or empty names, a name "__metadata__", a negative dimension,
// or nbytes != product(shape) * DTypeSize(dtype), or data == nullptr with nbytes > 0.
// Filesystem errors as WriteFileAtomic reports them (NOT_FOUND, RESOURCE_EXHAUSTED, ...).
absl::Status WriteSafetensors(const Dir& dir, const std::string& name, const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata);

}  // namespace oomb

#endif  // OOMB_WORKER_HF_SAFETENSORS_H_
