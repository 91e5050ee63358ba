#include "worker/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <torch/optim.h>
#include <torch/serialize.h>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "absl/strings/str_cat.h"
#include "worker/common/files.h"
#include "worker/common/status.h"
#include "worker/model/safetensors.h"

namespace oomb {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kManifest[] = "oomb_checkpoint.json";
constexpr char kState[] = "trainer_state.json";
constexpr char kOptimizer[] = "optimizer.pt";

absl::StatusOr<uint32_t> FileCrc32(const std::string& path, int64_t* size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::vector<char> buf(1 << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  *size = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = in.gcount();
    if (n <= 0) break;
    crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(n));
    *size += n;
  }
  return static_cast<uint32_t>(crc);
}

absl::Status FsyncFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", path, " to sync"));
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : absl::InternalError(absl::StrCat("cannot sync ", path));
}

int64_t StepOf(const std::string& dir) {
  auto text = ReadFile(dir + "/" + kState);
  if (!text.ok()) return -1;
  const json j = json::parse(*text, nullptr, false);
  return j.is_object() && j.contains("step") && j["step"].is_number_integer() ? j["step"].get<int64_t>() : -1;
}

}  // namespace

absl::StatusOr<int64_t> WriteCheckpoint(const std::string& dir, const Transformer& model,
                                        torch::optim::Optimizer& optimizer, const TrainerState& state,
                                        const CheckpointWriteOptions& options) {
  const std::string tmp = absl::StrCat(dir, ".tmp-", ::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  OOMB_RETURN_IF_ERROR(MakeDirs(tmp));
  if (model.has_lora()) {
    OOMB_RETURN_IF_ERROR(model.SaveLora(tmp, options.base_model_dir));
  } else {
    OOMB_RETURN_IF_ERROR(model.SaveFull(tmp, options.config_json));
  }
  try {
    torch::save(optimizer, tmp + "/" + kOptimizer);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("writing optimizer state: ", e.what_without_backtrace()));
  }
  OOMB_RETURN_IF_ERROR(FsyncFile(tmp + "/" + kOptimizer));
  const json st = {{"step", state.step},
                   {"epoch", state.epoch},
                   {"cursor", state.cursor},
                   {"tokens", state.tokens},
                   {"loss", state.loss}};
  OOMB_RETURN_IF_ERROR(WriteFileAtomic(tmp + "/" + kState, st.dump(2) + "\n"));
  for (const char* name :
       {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"}) {
    const std::string src = options.base_model_dir + "/" + name;
    if (!fs::exists(src)) continue;
    OOMB_ASSIGN_OR_RETURN(std::string contents, ReadFile(src));
    OOMB_RETURN_IF_ERROR(WriteFileAtomic(tmp + "/" + name, contents));
  }
  json manifest = {{"format", "oomb-checkpoint-1"}, {"step", state.step}, {"files", json::object()}};
  int64_t total = 0;
  for (const auto& e : fs::directory_iterator(tmp)) {
    if (!e.is_regular_file()) continue;
    int64_t size = 0;
    OOMB_ASSIGN_OR_RETURN(uint32_t crc, FileCrc32(e.path().string(), &size));
    manifest["files"][e.path().filename().string()] = {{"bytes", size}, {"crc32", crc}};
    total += size;
  }
  OOMB_RETURN_IF_ERROR(WriteFileAtomic(tmp + "/" + kManifest, manifest.dump(2) + "\n"));
  fs::remove_all(dir, ec);
  if (::rename(tmp.c_str(), dir.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", dir, ": ", std::strerror(errno)));
  }
  OOMB_RETURN_IF_ERROR(SyncDir(fs::path(dir).parent_path().string()));
  return total;
}

absl::Status VerifyCheckpoint(const std::string& dir) {
  OOMB_ASSIGN_OR_RETURN(std::string text, ReadFile(dir + "/" + kManifest));
  const json m = json::parse(text, nullptr, false);
  if (!m.is_object() || !m.contains("files") || !m["files"].is_object()) {
    return absl::DataLossError(absl::StrCat(dir, ": manifest is not valid"));
  }
  for (const auto& [name, info] : m["files"].items()) {
    int64_t size = 0;
    auto crc = FileCrc32(dir + "/" + name, &size);
    if (!crc.ok()) return absl::DataLossError(absl::StrCat(dir, ": ", name, " is missing"));
    if (size != info.value("bytes", int64_t{-1}) || *crc != info.value("crc32", uint32_t{0})) {
      return absl::DataLossError(absl::StrCat(dir, ": ", name, " does not match its checksum (torn or corrupted)"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> ListCheckpointDirs(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  static const std::regex kName(R"(checkpoint-(\d+)|final)");
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || !std::regex_match(name, kName)) continue;
    // `final` sorts before checkpoint-<same step>.
    found.emplace_back(StepOf(e.path().string()) * 2 + (name == "final" ? 1 : 0), e.path().string());
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

absl::StatusOr<TrainerState> RestoreCheckpoint(const std::string& dir, Transformer& model,
                                               torch::optim::Optimizer& optimizer) {
  OOMB_RETURN_IF_ERROR(VerifyCheckpoint(dir));
  if (model.has_lora()) {
    OOMB_RETURN_IF_ERROR(model.LoadLoraWeights(dir));
  } else {
    OOMB_ASSIGN_OR_RETURN(auto weights, WeightSet::Open(dir));
    at::NoGradGuard no_grad;
    for (auto& [name, p] : model.BaseParameters()) {
      const TensorView* v = weights->Find(name);
      if (v == nullptr) return absl::DataLossError(absl::StrCat(dir, ": missing tensor '", name, "'"));
      const auto src = at::from_blob(const_cast<void*>(v->data), v->shape, at::TensorOptions().dtype(p.scalar_type()));
      p.copy_(src);
    }
  }
  try {
    torch::load(optimizer, dir + "/" + kOptimizer);
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat(dir, ": optimizer state: ", e.what_without_backtrace()));
  }
  OOMB_ASSIGN_OR_RETURN(std::string text, ReadFile(dir + "/" + kState));
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return absl::DataLossError(absl::StrCat(dir, ": trainer_state.json is not valid"));
  TrainerState s;
  s.step = j.value("step", int64_t{0});
  s.epoch = j.value("epoch", int64_t{0});
  s.cursor = j.value("cursor", int64_t{0});
  s.tokens = j.value("tokens", int64_t{0});
  s.loss = j.value("loss", 0.0);
  return s;
}

void PruneCheckpoints(const std::string& root, int64_t keep_last) {
  int64_t kept = 0;
  std::error_code ec;
  for (const std::string& dir : ListCheckpointDirs(root)) {
    if (fs::path(dir).filename() == "final") continue;
    if (++kept > keep_last) fs::remove_all(dir, ec);
  }
}

}  // namespace oomb
