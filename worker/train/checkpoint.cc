#include "worker/train/checkpoint.h"

#include <unistd.h>
#include <zlib.h>

#include <torch/optim.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/common/status.h"
#include "worker/hf/loading_code.h"
#include "worker/hf/model_card.h"
#include "worker/hf/safetensors.h"

namespace oomb {
namespace {

using nlohmann::json;

constexpr char kManifest[] = "oomb_checkpoint.json";
constexpr char kState[] = "oomb_state.json";
constexpr char kHfState[] = "trainer_state.json";  // Hugging Face's; oomb's state before kState
constexpr char kOptimizer[] = "optimizer.pt";
constexpr char kPartial[] = ".tmp-";

absl::StatusOr<uint32_t> FileCrc32(const Dir& dir, const std::string& name, int64_t* size) {
  OOMB_ASSIGN_OR_RETURN(File f, dir.OpenFile(name));
  std::vector<char> buf(1 << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  *size = 0;
  for (;;) {
    const ssize_t n = ::pread(f.fd(), buf.data(), buf.size(), static_cast<off_t>(*size));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "read", f.path());
    if (n == 0) break;
    crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(n));
    *size += n;
  }
  return static_cast<uint32_t>(crc);
}

// The resume state of `dir` (TrainerState's keys): kState, or kHfState in a checkpoint written
// before kState existed.
absl::StatusOr<json> ReadState(const Dir& dir) {
  absl::StatusOr<std::string> text = dir.ReadFile(kState, 1 << 20);
  if (absl::IsNotFound(text.status())) text = dir.ReadFile(kHfState, 1 << 20);
  if (!text.ok()) return text.status();
  json j = json::parse(*text, nullptr, false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer() || !j.contains("cursor")) {
    return absl::DataLossError(absl::StrCat(dir.path(), ": ", kState, " is not valid"));
  }
  return j;
}

int64_t StepOf(const Dir& dir) {
  absl::StatusOr<json> j = ReadState(dir);
  return j.ok() ? (*j)["step"].get<int64_t>() : -1;
}

// LibTorch's serializer writing into `fd` (it calls back with each block).
absl::Status SaveOptimizer(torch::optim::Optimizer& optimizer, int fd, const std::string& path) {
  int err = 0;
  try {
    torch::save(optimizer, [fd, &err](const void* data, size_t n) -> size_t {
      size_t done = 0;
      while (done < n && err == 0) {
        const ssize_t w = ::write(fd, static_cast<const char*>(data) + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) err = errno;
        done += w > 0 ? static_cast<size_t>(w) : 0;
      }
      return err == 0 ? n : 0;
    });
  } catch (const c10::Error& e) {
    if (err == 0) return absl::InternalError(absl::StrCat("writing optimizer state: ", e.what_without_backtrace()));
  }
  return err == 0 ? absl::OkStatus() : ErrnoStatus(err, "write", path);
}

absl::Status LoadOptimizer(torch::optim::Optimizer& optimizer, const Dir& dir) {
  OOMB_ASSIGN_OR_RETURN(File f, dir.OpenFile(kOptimizer));
  try {
    torch::load(
        optimizer,
        [&f](uint64_t pos, void* buf, size_t n) -> size_t {
          const ssize_t r = ::pread(f.fd(), buf, n, static_cast<off_t>(pos));
          return r > 0 ? static_cast<size_t>(r) : 0;
        },
        [&f]() -> size_t { return static_cast<size_t>(f.size()); });
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat(dir.path(), ": optimizer state: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::Status WriteFiles(const Dir& tmp, const Transformer& model, torch::optim::Optimizer& optimizer,
                        const TrainerState& state, const CheckpointWriteOptions& options) {
  if (model.has_lora()) {
    OOMB_RETURN_IF_ERROR(model.SaveLora(tmp, options.base_model_path));
    if (!options.base_config_json.empty()) {
      OOMB_RETURN_IF_ERROR(tmp.WriteFileAtomic(kBaseConfigFile, options.base_config_json));
    }
  } else {
    OOMB_RETURN_IF_ERROR(model.SaveFull(tmp, options.config_json));
  }
  const std::string optimizer_path = tmp.PathOf(kOptimizer);
  OOMB_RETURN_IF_ERROR(
      tmp.WriteAtomic(kOptimizer, [&](int fd) { return SaveOptimizer(optimizer, fd, optimizer_path); }));
  const json st = {{"step", state.step},
                   {"epoch", state.epoch},
                   {"cursor", state.cursor},
                   {"tokens", state.tokens},
                   {"loss", state.loss}};
  OOMB_RETURN_IF_ERROR(tmp.WriteFileAtomic(kState, st.dump(2) + "\n"));
  if (!options.hf_trainer_state_json.empty()) {
    OOMB_RETURN_IF_ERROR(tmp.WriteFileAtomic(kHfState, options.hf_trainer_state_json));
  }
  if (!options.model_card.empty()) OOMB_RETURN_IF_ERROR(tmp.WriteFileAtomic(kModelCardFile, options.model_card));
  for (const auto& [name, contents] : options.base_files) OOMB_RETURN_IF_ERROR(tmp.WriteFileAtomic(name, contents));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> WriteManifest(const Dir& tmp, const TrainerState& state) {
  json manifest = {{"format", "oomb-checkpoint-1"}, {"step", state.step}, {"files", json::object()}};
  int64_t total = 0;
  OOMB_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, tmp.List());
  for (const DirEntry& e : entries) {
    if (e.type != EntryType::kFile) continue;
    int64_t size = 0;
    OOMB_ASSIGN_OR_RETURN(uint32_t crc, FileCrc32(tmp, e.name, &size));
    manifest["files"][e.name] = {{"bytes", size}, {"crc32", crc}};
    total += size;
  }
  OOMB_RETURN_IF_ERROR(tmp.WriteFileAtomic(kManifest, manifest.dump(2) + "\n"));
  return total;
}

}  // namespace

absl::StatusOr<int64_t> WriteCheckpoint(const Dir& root, const std::string& name, const Transformer& model,
                                        torch::optim::Optimizer& optimizer, const TrainerState& state,
                                        const CheckpointWriteOptions& options) {
  const std::string tmp_name = absl::StrCat(name, kPartial, ::getpid());
  OOMB_RETURN_IF_ERROR(root.RemoveTree(tmp_name));
  absl::StatusOr<int64_t> total = [&]() -> absl::StatusOr<int64_t> {
    OOMB_ASSIGN_OR_RETURN(Dir tmp, root.MakeDir(tmp_name));
    OOMB_RETURN_IF_ERROR(WriteFiles(tmp, model, optimizer, state, options));
    return WriteManifest(tmp, state);
  }();
  if (total.ok()) {
    OOMB_RETURN_IF_ERROR(root.RemoveTree(name));
    absl::Status renamed = root.Rename(tmp_name, name);
    if (renamed.ok()) renamed = root.Sync();
    if (renamed.ok()) return total;
    total = renamed;
  }
  (void)root.RemoveTree(tmp_name);  // what a full disk left; the error is the write's
  return total.status();
}

absl::Status VerifyCheckpoint(const Dir& dir) {
  OOMB_ASSIGN_OR_RETURN(std::string text, dir.ReadFile(kManifest, 16 << 20));
  const json m = json::parse(text, nullptr, false);
  if (!m.is_object() || !m.contains("files") || !m["files"].is_object()) {
    return absl::DataLossError(absl::StrCat(dir.path(), ": manifest is not valid"));
  }
  for (const auto& [name, info] : m["files"].items()) {
    int64_t size = 0;
    auto crc = FileCrc32(dir, name, &size);
    if (!crc.ok()) return absl::DataLossError(absl::StrCat(dir.path(), ": ", name, " is missing"));
    if (size != info.value("bytes", int64_t{-1}) || *crc != info.value("crc32", uint32_t{0})) {
      return absl::DataLossError(
          absl::StrCat(dir.path(), ": ", name, " does not match its checksum (torn or corrupted)"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> ListCheckpointDirs(const Dir& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  static const std::regex kName(R"(checkpoint-(\d+)|final)");
  absl::StatusOr<std::vector<DirEntry>> entries = root.List();
  if (!entries.ok()) return {};
  for (const DirEntry& e : *entries) {
    if (e.type != EntryType::kDirectory || !std::regex_match(e.name, kName)) continue;
    absl::StatusOr<Dir> dir = root.OpenDir(e.name);
    // `final` sorts before checkpoint-<same step>.
    found.emplace_back((dir.ok() ? StepOf(*dir) : -1) * 2 + (e.name == "final" ? 1 : 0), e.name);
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

absl::StatusOr<TrainerState> RestoreCheckpoint(const Dir& dir, Transformer& model, torch::optim::Optimizer& optimizer) {
  OOMB_RETURN_IF_ERROR(VerifyCheckpoint(dir));
  if (model.has_lora()) {
    OOMB_RETURN_IF_ERROR(model.LoadLoraWeights(dir));
  } else {
    OOMB_ASSIGN_OR_RETURN(auto weights, WeightSet::Open(dir));
    at::NoGradGuard no_grad;
    for (auto& [name, p] : model.StoredWeights()) {
      const TensorView* v = weights->Find(name);
      if (v == nullptr) return absl::DataLossError(absl::StrCat(dir.path(), ": missing tensor '", name, "'"));
      const auto src = at::from_blob(const_cast<void*>(v->data), v->shape, at::TensorOptions().dtype(p.scalar_type()));
      p.copy_(src);
    }
  }
  OOMB_RETURN_IF_ERROR(LoadOptimizer(optimizer, dir));
  OOMB_ASSIGN_OR_RETURN(const json j, ReadState(dir));
  TrainerState s;
  s.step = j.value("step", int64_t{0});
  s.epoch = j.value("epoch", int64_t{0});
  s.cursor = j.value("cursor", int64_t{0});
  s.tokens = j.value("tokens", int64_t{0});
  s.loss = j.value("loss", 0.0);
  return s;
}

void PruneCheckpoints(const Dir& root, int64_t keep_last) {
  int64_t kept = 0;
  for (const std::string& name : ListCheckpointDirs(root)) {
    if (name == "final") continue;
    if (++kept > keep_last) (void)root.RemoveTree(name);
  }
}

absl::Status RemovePartialCheckpoints(const Dir& root) {
  // A checkpoint's temporary directory, and Dir::WriteAtomic's temporary files.
  static const std::regex kPartialName(R"((checkpoint-\d+|final)\.tmp-\d+|\..+\.tmp-\d+-\d+)");
  OOMB_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, root.List());
  for (const DirEntry& e : entries) {
    if (std::regex_match(e.name, kPartialName)) OOMB_RETURN_IF_ERROR(root.RemoveTree(e.name));
  }
  return absl::OkStatus();
}

}  // namespace oomb
