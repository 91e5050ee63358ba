#include "worker/hf/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "worker/common/status.h"

namespace oomb {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
  int write_rank;  // position in the Rust crate's Dtype enum order; higher is written first
};

constexpr std::array<DTypeInfo, 10> kDTypes = {{
    {DType::kF64, "F64", 8, 8},
    {DType::kF32, "F32", 4, 7},
    {DType::kF16, "F16", 2, 4},
    {DType::kBF16, "BF16", 2, 5},
    {DType::kI64, "I64", 8, 9},
    {DType::kI32, "I32", 4, 6},
    {DType::kI16, "I16", 2, 3},
    {DType::kI8, "I8", 1, 2},
    {DType::kU8, "U8", 1, 1},
    {DType::kBool, "BOOL", 1, 0},
}};

const DTypeInfo& Info(DType dtype) { return kDTypes[static_cast<size_t>(dtype)]; }

// Parses `text` as JSON, rejecting duplicate object keys (nlohmann would silently keep the last
// one, and for safetensors a duplicate tensor name is a corrupt header).
absl::StatusOr<Json> ParseJsonStrict(std::string_view text, const std::string& what) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  Json::parser_callback_t cb = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  Json j = Json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(what, ": header is not valid JSON"));
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": duplicate key '", duplicate, "' in JSON"));
  }
  return j;
}

absl::Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "write", path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

}  // namespace

size_t DTypeSize(DType dtype) { return Info(dtype).size; }

std::string_view DTypeName(DType dtype) { return Info(dtype).name; }

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", std::string(name), "'"));
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > INT64_MAX / d) return -1;
    n *= d;
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

namespace {

absl::Status Invalid(const std::string& path, const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", msg));
}

// One header entry checked against the data section (`data`, `data_size` bytes).
absl::StatusOr<TensorView> ParseTensorEntry(const std::string& path, const std::string& name, const Json& entry,
                                            const unsigned char* data, size_t data_size) {
  auto bad = [&](const std::string& msg) { return Invalid(path, absl::StrCat("tensor '", name, "': ", msg)); };
  if (!entry.is_object()) return bad("entry is not an object");
  TensorView view;
  view.name = name;
  auto dt = entry.find("dtype");
  if (dt == entry.end() || !dt->is_string()) return bad("missing or non-string 'dtype'");
  auto parsed = ParseDType(dt->get<std::string>());
  if (!parsed.ok()) return bad(std::string(parsed.status().message()));
  view.dtype = *parsed;
  auto sh = entry.find("shape");
  if (sh == entry.end() || !sh->is_array()) return bad("missing or non-array 'shape'");
  for (const Json& d : *sh) {
    if (!d.is_number_unsigned()) return bad(absl::StrCat("shape ", sh->dump(), " has a non-negative-integer entry"));
    const uint64_t v = d.get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX)) return bad(absl::StrCat("shape ", sh->dump(), " is too large"));
    view.shape.push_back(static_cast<int64_t>(v));
  }
  auto off = entry.find("data_offsets");
  if (off == entry.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned()) {
    return bad("'data_offsets' must be an array of two non-negative integers");
  }
  const uint64_t begin = (*off)[0].get<uint64_t>();
  const uint64_t end = (*off)[1].get<uint64_t>();
  if (begin > end) return bad(absl::StrCat("data_offsets [", begin, ",", end, "] have begin > end"));
  if (end > data_size) {
    return bad(absl::StrCat("data_offsets [", begin, ",", end, "] exceed the data section of ", data_size,
                            " bytes (truncated file?)"));
  }
  const int64_t n = NumElements(view.shape);
  const size_t esize = DTypeSize(view.dtype);
  if (n < 0 || static_cast<uint64_t>(n) > UINT64_MAX / esize) return bad("shape overflows");
  if (static_cast<uint64_t>(n) * esize != end - begin) {
    return bad(absl::StrCat("shape ", sh->dump(), " of ", std::string(DTypeName(view.dtype)), " needs ",
                            static_cast<uint64_t>(n) * esize, " bytes but data_offsets [", begin, ",", end, "] span ",
                            end - begin));
  }
  view.data = data + begin;
  view.nbytes = static_cast<size_t>(end - begin);
  return view;
}

// Sorts `tensors` by address and rejects two whose bytes overlap.
absl::Status SortAndCheckDisjoint(const std::string& path, std::vector<TensorView>& tensors,
                                  const unsigned char* data) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorView& a, const TensorView& b) {
    const auto* pa = static_cast<const unsigned char*>(a.data);
    const auto* pb = static_cast<const unsigned char*>(b.data);
    if (pa != pb) return pa < pb;
    return a.nbytes < b.nbytes;
  });
  for (size_t i = 1; i < tensors.size(); ++i) {
    const TensorView& a = tensors[i - 1];
    const TensorView& b = tensors[i];
    // Empty tensors occupy no bytes and cannot overlap anything.
    if (a.nbytes == 0 || b.nbytes == 0) continue;
    if (static_cast<const unsigned char*>(a.data) + a.nbytes > static_cast<const unsigned char*>(b.data)) {
      const auto off = [data](const TensorView& t) { return static_cast<const unsigned char*>(t.data) - data; };
      return Invalid(path,
                     absl::StrCat("tensor '", b.name, "': data_offsets [", off(b), ",", off(b) + b.nbytes,
                                  "] overlap those of tensor '", a.name, "' [", off(a), ",", off(a) + a.nbytes, "]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const File& file) {
  const std::string& path = file.path();
  auto invalid = [&](const std::string& msg) { return Invalid(path, msg); };
  const size_t size = static_cast<size_t>(file.size());
  if (size < 8) {
    return invalid(absl::StrCat("file has ", size, " bytes, fewer than the 8-byte header length (truncated file?)"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  if (map == MAP_FAILED) return invalid(absl::StrCat("cannot mmap: ", std::strerror(errno)));

  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = map;
  f->map_size_ = size;
  const auto* bytes = static_cast<const unsigned char*>(map);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeaderBytes) {
    return invalid(absl::StrCat("header length ", header_len, " exceeds the limit of ", kMaxHeaderBytes, " bytes"));
  }
  if (header_len > size - 8) {
    return invalid(
        absl::StrCat("header length ", header_len, " exceeds the file size of ", size, " bytes (truncated file?)"));
  }
  const std::string_view header(reinterpret_cast<const char*>(bytes + 8), header_len);
  OOMB_ASSIGN_OR_RETURN(Json j, ParseJsonStrict(header, path));
  if (!j.is_object()) return invalid("header is not a JSON object");

  const size_t data_size = size - 8 - header_len;
  const unsigned char* data = bytes + 8 + header_len;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const Json& entry = it.value();
    if (it.key() != "__metadata__") {
      OOMB_ASSIGN_OR_RETURN(TensorView view, ParseTensorEntry(path, it.key(), entry, data, data_size));
      f->tensors_.push_back(std::move(view));
      continue;
    }
    if (!entry.is_object()) return invalid("'__metadata__' is not an object");
    for (auto m = entry.begin(); m != entry.end(); ++m) {
      if (!m.value().is_string()) {
        return invalid(absl::StrCat("'__metadata__' value of '", m.key(), "' is not a string"));
      }
      f->metadata_[m.key()] = m.value().get<std::string>();
    }
  }
  OOMB_RETURN_IF_ERROR(SortAndCheckDisjoint(path, f->tensors_, data));
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_.emplace(f->tensors_[i].name, i);
  return f;
}

const TensorView* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------------------------
// WeightSet

absl::StatusOr<std::unique_ptr<WeightSet>> WeightSet::Open(const Dir& dir, const std::string& file_name) {
  std::string chosen = file_name;
  if (chosen.empty()) {
    if (dir.Contains("model.safetensors")) {
      chosen = "model.safetensors";
    } else if (dir.Contains("model.safetensors.index.json")) {
      chosen = "model.safetensors.index.json";
    } else {
      return absl::NotFoundError(absl::StrCat(
          dir.path(), ": no model.safetensors or model.safetensors.index.json (not a safetensors model dir?)"));
    }
  }
  const std::string path = dir.PathOf(chosen);
  std::unique_ptr<WeightSet> ws(new WeightSet());

  if (chosen.size() < 5 || chosen.substr(chosen.size() - 5) != ".json") {
    OOMB_ASSIGN_OR_RETURN(File f, dir.OpenFile(chosen));
    OOMB_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(f));
    for (const TensorView& t : file->tensors()) ws->by_name_.emplace(t.name, &t);
    ws->files_.push_back(std::move(file));
    return ws;
  }

  // A sharded checkpoint: validate the index, then each shard.
  OOMB_ASSIGN_OR_RETURN(std::string text, dir.ReadFile(chosen, kMaxHeaderBytes));
  OOMB_ASSIGN_OR_RETURN(Json index, ParseJsonStrict(text, path));
  auto invalid = [&](const std::string& msg) { return absl::InvalidArgumentError(absl::StrCat(path, ": ", msg)); };
  if (!index.is_object()) return invalid("index is not a JSON object");
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) return invalid("missing or non-object 'weight_map'");
  std::map<std::string, std::vector<std::string>> by_shard;  // shard -> tensors mapped to it
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string()) return invalid(absl::StrCat("tensor '", it.key(), "': shard is not a string"));
    const std::string shard = it.value().get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
      return invalid(absl::StrCat("tensor '", it.key(), "': shard '", shard, "' is not a plain file name"));
    }
    by_shard[shard].push_back(it.key());
  }
  std::map<std::string, std::string> owner;  // tensor -> shard that contains it
  for (const auto& [shard, names] : by_shard) {
    absl::StatusOr<File> shard_file = dir.OpenFile(shard);
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
        shard_file.ok() ? SafetensorsFile::Open(*shard_file) : shard_file.status();
    if (!file.ok()) {
      if (absl::IsNotFound(file.status())) {
        return absl::NotFoundError(absl::StrCat(path, ": shard '", shard, "' (holding tensor '", names.front(),
                                                "' and ", names.size() - 1, " more) does not exist"));
      }
      return file.status();
    }
    for (const std::string& name : names) {
      if ((*file)->Find(name) == nullptr) {
        return invalid(absl::StrCat("tensor '", name, "' is mapped to shard '", shard, "', which does not contain it"));
      }
    }
    for (const TensorView& t : (*file)->tensors()) {
      auto [it, inserted] = owner.emplace(t.name, shard);
      if (!inserted) {
        return invalid(
            absl::StrCat("tensor '", t.name, "' appears in two shards: '", it->second, "' and '", shard, "'"));
      }
      ws->by_name_.emplace(t.name, &t);
    }
    ws->files_.push_back(*std::move(file));
  }
  return ws;
}

const TensorView* WeightSet::Find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<std::string> WeightSet::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, view] : by_name_) out.push_back(name);
  return out;
}

// ---------------------------------------------------------------------------------------------
// WriteSafetensors

absl::Status WriteSafetensors(const Dir& dir, const std::string& name, const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  const std::string path = dir.PathOf(name);
  std::vector<const TensorView*> order;
  std::set<std::string_view> seen;
  for (const TensorView& t : tensors) {
    auto bad = [&](const std::string& msg) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", t.name, "': ", msg));
    };
    if (t.name.empty() || t.name == "__metadata__") return bad("invalid tensor name");
    if (!seen.insert(t.name).second) return bad("duplicate tensor name");
    const int64_t n = NumElements(t.shape);
    if (n < 0) return bad("shape has a negative dimension or overflows");
    if (static_cast<uint64_t>(n) * DTypeSize(t.dtype) != t.nbytes) {
      return bad(absl::StrCat("nbytes ", t.nbytes, " != ", n, " elements * ", DTypeSize(t.dtype), " bytes"));
    }
    if (t.data == nullptr && t.nbytes > 0) return bad("data is null");
    order.push_back(&t);
  }
  std::stable_sort(order.begin(), order.end(), [](const TensorView* a, const TensorView* b) {
    const int ra = Info(a->dtype).write_rank, rb = Info(b->dtype).write_rank;
    if (ra != rb) return ra > rb;
    return a->name < b->name;
  });

  // nlohmann's ordered_json keeps insertion order, which is what the Python writer emits.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;  // std::map: sorted keys
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const TensorView* t : order) {
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = std::string(DTypeName(t->dtype));
    entry["shape"] = t->shape;
    entry["data_offsets"] = {offset, offset + t->nbytes};
    header[t->name] = std::move(entry);
    offset += t->nbytes;
  }
  std::string text;
  try {
    text = header.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::strict);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": a tensor name or metadata string is not valid UTF-8"));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len_le[8];
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<unsigned char>((uint64_t{text.size()} >> (8 * i)) & 0xff);

  return dir.WriteAtomic(name, [&](int fd) {
    OOMB_RETURN_IF_ERROR(WriteAll(fd, len_le, 8, path));
    OOMB_RETURN_IF_ERROR(WriteAll(fd, text.data(), text.size(), path));
    for (const TensorView* t : order) OOMB_RETURN_IF_ERROR(WriteAll(fd, t->data, t->nbytes, path));
    return absl::OkStatus();
  });
}

}  // namespace oomb
