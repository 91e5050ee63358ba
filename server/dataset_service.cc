#include "server/dataset_service.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/time_util.h"
#include "proto/spec/resource_names.h"
#include "server/grpc_status.h"
#include "server/page_token.h"
#include "server/piece_pipeline.h"
#include "worker/common/status.h"
#include "worker/data/dataset.h"

namespace oomb::server {
namespace {

constexpr char kPartialPrefix[] = ".upload-";
// How far the slowest of hashing, writing and checking may fall behind what arrived.
constexpr size_t kMaxPendingBytes = size_t{16} << 20;

// The threads that check an upload's lines: the check is the slowest of the stages (about
// 350-900 MB/s a core, measured), so a quarter of the cores, up to 4, for uploads at disk speed.
int CheckThreads() { return static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 4, 1u, 4u)); }
constexpr int kDefaultPageSize = 50;
constexpr int kMaxPageSize = 1000;

std::string RandomSuffix(int n) {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string out;
  for (int i = 0; i < n; ++i) out += kAlphabet[rng() % 36];
  return out;
}

bool IsHex64(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// Runs a unary handler body with what the authorization step found (server/authorization.h).
template <typename Fn>
grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, absl::StatusOr<Authorization> authorized, Fn&& body) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(authorized.ok() ? body(*authorized) : authorized.status()));
  return reactor;
}

}  // namespace

// One upload: the reactor of its client stream (see the header for the steps).
class DatasetServiceImpl::Upload final : public grpc::ServerReadReactor<v1::UploadDatasetRequest> {
 public:
  Upload(DatasetServiceImpl* service, grpc::CallbackServerContext* ctx, v1::Dataset* resp)
      : service_(service), ctx_(ctx), resp_(resp), sha_(EVP_MD_CTX_new()) {
    StartRead(&message_);
  }
  ~Upload() override { EVP_MD_CTX_free(sha_); }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client sent its last message, or went away
      if (ctx_->IsCancelled()) return Fail(absl::CancelledError("the client went away"));
      if (!started_) return Fail(absl::InvalidArgumentError("the upload sent no message"));
      return LastArrived();
    }
    absl::Status s = started_ ? LaterHash(message_) : Begin(message_);
    if (s.ok()) s = Count(message_.data().size());
    if (s.ok()) s = pipeline_->status();  // a bad line ends the upload without waiting for the rest
    if (!s.ok()) return Fail(s);
    std::string bytes = std::move(*message_.mutable_data());
    message_.Clear();
    if (pipeline_->Push(std::move(bytes))) StartRead(&message_);  // else the pipeline starts it when it has room
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Begin(const v1::UploadDatasetRequest& first) {
    started_ = true;
    // The authorization step takes the first message, which names the project (parent).
    OOMB_ASSIGN_OR_RETURN(Authorization authorized, service_->Authorize(ctx_, first));
    caller_ = std::move(authorized.caller);
    project_ = std::move(authorized.project);
    id_ = first.dataset_id().empty() ? "ds-" + RandomSuffix(10) : first.dataset_id();
    if (!names::ValidId(id_)) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset_id: must match [a-z0-9][a-z0-9-]{0,62}, got '", Excerpt(id_), "'"));
    }
    if (first.display_name().size() > 256) return absl::InvalidArgumentError("display_name: at most 256 bytes");
    if (!first.sha256().empty() && !IsHex64(absl::AsciiStrToLower(first.sha256()))) {
      return absl::InvalidArgumentError("sha256: expected 64 hexadecimal digits");
    }
    if (first.size_bytes() < 0) return absl::InvalidArgumentError("size_bytes: must be >= 0");
    name_ = names::Dataset(project_, id_);
    display_name_ = first.display_name();
    want_sha256_ = absl::AsciiStrToLower(first.sha256());
    want_size_ = first.size_bytes();
    if (service_->options_.projects != nullptr) {
      const int64_t quota = service_->options_.projects->Get(project_).max_storage_bytes;
      if (quota > 0) {
        OOMB_ASSIGN_OR_RETURN(const int64_t used, service_->store_->DatasetBytes(project_));
        room_ = quota - used;
        quota_ = quota;
        if (want_size_ > room_) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "project ", project_, " stores ", used, " bytes of datasets; ", want_size_,
              " more would pass its max_storage_bytes (", quota, " in tenancy.projects_file): delete some first"));
        }
      }
    }
    OOMB_RETURN_IF_ERROR(service_->BeginUpload(project_, name_));
    registered_ = true;
    OOMB_ASSIGN_OR_RETURN(dir_, service_->options_.files->OpenDatasetsDir(project_));
    temp_ = kPartialPrefix + RandomSuffix(16);
    fd_ = UniqueFd(::openat(dir_->fd(), temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd_.valid()) return ErrnoStatus(errno, "create", dir_->PathOf(temp_));
    EVP_DigestInit_ex(sha_, EVP_sha256(), nullptr);
    checker_.emplace("data", display_name_.empty() ? id_ : display_name_, CheckThreads(),
                     service_->options_.max_line_bytes, "uploads.max_line_bytes");
    // Hashing, writing and checking side by side, this thread only receiving.
    std::vector<PiecePipeline::Stage> stages = {
        [this](const PiecePipeline::Piece& piece) {
          EVP_DigestUpdate(sha_, piece->data(), piece->size());
          return absl::OkStatus();
        },
        [this](const PiecePipeline::Piece& piece) { return Write(*piece); },
        [this](const PiecePipeline::Piece& piece) { return checker_->Feed(piece); },
    };
    pipeline_ = std::make_unique<PiecePipeline>(std::move(stages), kMaxPendingBytes, [this] { StartRead(&message_); });
    return absl::OkStatus();
  }

  // After the client's last message: the rest on the WorkPool (here when it is full, rather than
  // lose what was sent).
  void LastArrived() {
    if (service_->options_.work == nullptr || !service_->options_.work->TrySubmit([this] { Complete(); })) {
      Complete();
    }
  }

  // A sha256 in a message after the first (a client that hashes the file as it sends it).
  absl::Status LaterHash(const v1::UploadDatasetRequest& m) {
    if (m.sha256().empty()) return absl::OkStatus();
    if (!want_sha256_.empty()) return absl::InvalidArgumentError("sha256: given in more than one message");
    if (!IsHex64(absl::AsciiStrToLower(m.sha256()))) {
      return absl::InvalidArgumentError("sha256: expected 64 hexadecimal digits");
    }
    want_sha256_ = absl::AsciiStrToLower(m.sha256());
    return absl::OkStatus();
  }

  // The size and quota checks of `n` more bytes.
  absl::Status Count(size_t n) {
    bytes_ += static_cast<int64_t>(n);
    if (want_size_ > 0 && bytes_ > want_size_) {
      return absl::InvalidArgumentError(absl::StrCat("size_bytes: ", want_size_, " declared, more arrived"));
    }
    if (quota_ > 0 && bytes_ > room_) {
      return absl::ResourceExhaustedError(absl::StrCat("project ", project_, "'s datasets would pass its ",
                                                       "max_storage_bytes (", quota_, " in tenancy.projects_file)"));
    }
    return absl::OkStatus();
  }

  absl::Status Write(const std::string& piece) {
    for (size_t done = 0; done < piece.size();) {
      const ssize_t n = ::write(fd_.get(), piece.data() + done, piece.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus(errno, "write", dir_->PathOf(temp_));
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  // After the last message: verify, check the records, name the file, store the record.
  void Complete() {
    absl::StatusOr<v1::Dataset> d = Finalize();
    if (!d.ok()) return Fail(d.status());
    *resp_ = *std::move(d);
    Cleanup();
    spdlog::info("uploaded {} ({} bytes, {} records) by {}", name_, resp_->size_bytes(), resp_->records(),
                 caller_.Name());
    Finish(grpc::Status::OK);
  }

  absl::StatusOr<v1::Dataset> Finalize() {
    OOMB_RETURN_IF_ERROR(pipeline_->Finish());
    if (::fsync(fd_.get()) != 0) return ErrnoStatus(errno, "fsync", dir_->PathOf(temp_));
    fd_ = UniqueFd();
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int digest_len = 0;
    EVP_DigestFinal_ex(sha_, digest, &digest_len);
    const std::string sha = absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(digest), digest_len));
    if (!want_sha256_.empty() && sha != want_sha256_) {
      return absl::InvalidArgumentError(
          absl::StrCat("sha256: ", want_sha256_, " declared, but what arrived has ", sha, " (", bytes_, " bytes)"));
    }
    if (want_size_ > 0 && bytes_ != want_size_) {
      return absl::InvalidArgumentError(absl::StrCat("size_bytes: ", want_size_, " declared, ", bytes_, " arrived"));
    }
    OOMB_ASSIGN_OR_RETURN(const RecordCounts counts, checker_->Finish());
    v1::Dataset d;
    d.set_name(name_);
    d.set_display_name(display_name_);
    d.set_size_bytes(bytes_);
    d.set_sha256(sha);
    *d.mutable_create_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
    d.set_creator(caller_.user.empty() ? service_->ClientIdentity(ctx_) : caller_.user);
    d.set_records(counts.records);
    for (size_t k = 0; k < kRecordKinds; ++k) {
      if (counts.by_kind[k] > 0)
        (*d.mutable_record_kinds())[std::string(RecordKindName(static_cast<RecordKind>(k)))] = counts.by_kind[k];
    }
    return Place(d);
  }

  // The file takes its name, never replacing another dataset's; then the record.
  absl::StatusOr<v1::Dataset> Place(const v1::Dataset& d) {
    const std::string final_name = id_ + ".jsonl";
    bool linked = ::linkat(dir_->fd(), temp_.c_str(), dir_->fd(), final_name.c_str(), 0) == 0;
    if (!linked && errno != EEXIST) return ErrnoStatus(errno, "link", dir_->PathOf(final_name));
    if (!linked && absl::IsNotFound(service_->store_->GetDataset(name_).status())) {
      // A file without a record: what a crash between the two left. Ours replaces it.
      if (::renameat(dir_->fd(), temp_.c_str(), dir_->fd(), final_name.c_str()) != 0) {
        return ErrnoStatus(errno, "rename", dir_->PathOf(final_name));
      }
      linked = true;
    }
    bool created = false;
    absl::StatusOr<v1::Dataset> recorded = service_->store_->CreateDataset(d, quota_, &created);
    if (!recorded.ok() && linked) ::unlinkat(dir_->fd(), final_name.c_str(), 0);
    OOMB_RETURN_IF_ERROR(recorded.status());
    OOMB_RETURN_IF_ERROR(dir_->Sync());
    return recorded;
  }

  void Fail(const absl::Status& s) {
    Cleanup();
    Finish(ToGrpcStatus(s));
  }

  void Cleanup() {
    pipeline_.reset();  // its threads stopped before the file goes
    fd_ = UniqueFd();
    if (dir_.has_value() && !temp_.empty()) ::unlinkat(dir_->fd(), temp_.c_str(), 0);
    temp_.clear();
    if (registered_) service_->EndUpload(project_, name_);
    registered_ = false;
  }

  DatasetServiceImpl* const service_;
  grpc::CallbackServerContext* const ctx_;
  v1::Dataset* const resp_;
  EVP_MD_CTX* const sha_;
  Caller caller_;  // as the authorization step of the first message found it
  v1::UploadDatasetRequest message_;
  bool started_ = false, registered_ = false;
  std::string project_, id_, name_, display_name_, want_sha256_;
  int64_t want_size_ = 0, bytes_ = 0, room_ = 0, quota_ = 0;
  std::optional<Dir> dir_;
  std::string temp_;
  UniqueFd fd_;
  std::optional<JsonlRecordChecker> checker_;  // created by Begin, fed by a stage
  std::unique_ptr<PiecePipeline> pipeline_;    // created by Begin; stopped by Cleanup
};

DatasetServiceImpl::DatasetServiceImpl(JobStore* store, DatasetServiceOptions options)
    : store_(store), options_(std::move(options)) {}

std::string DatasetServiceImpl::ClientIdentity(const grpc::CallbackServerContext* ctx) const {
  return options_.auth != nullptr ? options_.auth->ClientIdentity(*ctx) : PeerIdentity(*ctx);
}

void DatasetServiceImpl::RemovePartialUploads() const {
  absl::StatusOr<Dir> root = FileAccess::Unconfined()->OpenDir(options_.files->datasets_dir());
  if (!root.ok()) return;
  absl::StatusOr<std::vector<DirEntry>> projects = root->List();
  if (!projects.ok()) return;
  for (const DirEntry& p : *projects) {
    if (p.type != EntryType::kDirectory) continue;
    absl::StatusOr<Dir> dir = root->OpenDir(p.name);
    absl::StatusOr<std::vector<DirEntry>> files = dir.ok() ? dir->List() : dir.status();
    if (!files.ok()) continue;
    for (const DirEntry& f : *files) {
      if (!absl::StartsWith(f.name, kPartialPrefix)) continue;
      spdlog::info("removing {}, left by an upload a stop interrupted", dir->PathOf(f.name));
      (void)dir->RemoveTree(f.name);
    }
  }
}

absl::StatusOr<Authorization> DatasetServiceImpl::Authorize(const grpc::CallbackServerContext* ctx,
                                                            const google::protobuf::Message& request) const {
  return options_.authorizer->Authorize(*ctx, request);
}

absl::Status DatasetServiceImpl::BeginUpload(const std::string& project, const std::string& name) {
  int64_t per_project = options_.max_concurrent_uploads_per_project;
  const char* per_project_key = "uploads.max_concurrent_per_project";
  if (options_.projects != nullptr) {
    if (const int64_t own = options_.projects->Get(project).max_concurrent_uploads; own > 0) {
      per_project = own;
      per_project_key = "max_concurrent_uploads in tenancy.projects_file";
    }
  }
  absl::MutexLock lock(&mu_);
  if (uploading_.count(name) > 0) {
    return absl::AbortedError(absl::StrCat("an upload of ", name, " is in progress; retry when it has ended"));
  }
  int64_t& of_project = uploading_by_project_[project];
  if (of_project >= per_project) {
    if (of_project == 0) uploading_by_project_.erase(project);
    return absl::ResourceExhaustedError(absl::StrCat("project ", project, " has ", of_project,
                                                     " uploads in progress, its limit (", per_project_key, " ",
                                                     per_project, "); retry when one has ended"));
  }
  if (static_cast<int64_t>(uploading_.size()) >= options_.max_concurrent_uploads) {
    if (of_project == 0) uploading_by_project_.erase(project);
    return absl::ResourceExhaustedError(absl::StrCat("the daemon has ", uploading_.size(),
                                                     " uploads in progress, its limit (uploads.max_concurrent ",
                                                     options_.max_concurrent_uploads, "); retry when one has ended"));
  }
  uploading_.insert(name);
  ++of_project;
  return absl::OkStatus();
}

void DatasetServiceImpl::EndUpload(const std::string& project, const std::string& name) {
  absl::MutexLock lock(&mu_);
  uploading_.erase(name);
  if (auto it = uploading_by_project_.find(project); it != uploading_by_project_.end() && --it->second <= 0) {
    uploading_by_project_.erase(it);
  }
}

grpc::ServerReadReactor<v1::UploadDatasetRequest>* DatasetServiceImpl::UploadDataset(grpc::CallbackServerContext* ctx,
                                                                                     v1::Dataset* resp) {
  return new Upload(this, ctx, resp);
}

grpc::ServerUnaryReactor* DatasetServiceImpl::GetDataset(grpc::CallbackServerContext* ctx,
                                                         const v1::GetDatasetRequest* req, v1::Dataset* resp) {
  return Unary(ctx, Authorize(ctx, *req), [&](Authorization& a) -> absl::Status {
    *resp = *std::move(a.dataset);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* DatasetServiceImpl::ListDatasets(grpc::CallbackServerContext* ctx,
                                                           const v1::ListDatasetsRequest* req,
                                                           v1::ListDatasetsResponse* resp) {
  return Unary(ctx, Authorize(ctx, *req), [&](Authorization& a) -> absl::Status {
    if (req->page_size() < 0) return absl::InvalidArgumentError("page_size: must be >= 0");
    std::vector<std::string> projects;  // empty: every project
    if (a.list_projects.has_value()) {
      if (a.list_projects->empty()) return absl::OkStatus();  // no project: no datasets
      projects = *a.list_projects;
    }
    const int size = req->page_size() == 0 ? kDefaultPageSize : std::min(req->page_size(), kMaxPageSize);
    const uint64_t filter = FilterHash(req->parent());
    int64_t before = 0;
    if (!req->page_token().empty()) {
      OOMB_ASSIGN_OR_RETURN(before, DecodePageToken(req->page_token(), filter, "ListDatasets"));
    }
    OOMB_ASSIGN_OR_RETURN(DatasetPage page, store_->ListDatasets(projects, size, before));
    for (v1::Dataset& d : page.datasets) *resp->add_datasets() = std::move(d);
    if (page.next_position > 0) resp->set_next_page_token(EncodePageToken(page.next_position, filter));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* DatasetServiceImpl::DeleteDataset(grpc::CallbackServerContext* ctx,
                                                            const v1::DeleteDatasetRequest* req,
                                                            v1::DeleteDatasetResponse*) {
  return Unary(ctx, Authorize(ctx, *req), [&](Authorization& a) -> absl::Status {
    const v1::Dataset& d = *a.dataset;
    OOMB_RETURN_IF_ERROR(store_->DeleteDataset(d.name()));  // first: no job resolves it any more
    const names::DatasetName ref = *names::ParseDataset(d.name());
    OOMB_ASSIGN_OR_RETURN(const Dir dir, options_.files->OpenDatasetsDir(ref.project));
    OOMB_RETURN_IF_ERROR(dir.RemoveTree(ref.dataset + ".jsonl"));
    spdlog::info("deleted {} by {}", d.name(), a.caller.Name());
    return absl::OkStatus();
  });
}

}  // namespace oomb::server
