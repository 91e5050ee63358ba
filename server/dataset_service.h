// The gRPC DatasetService (proto/oomb/v1/datasets.proto) on the callback API: uploaded datasets,
// their records in the JobStore, their files in the datasets dir (JobFiles::DatasetPath).
//
// An upload streams into a temporary file in the project's datasets directory
// (".upload-<random>", mode 0600) as its messages arrive; a declared size_bytes, or the
// project's max_storage_bytes, ends it as soon as the bytes pass them. gRPC's thread only
// receives: hashing (SHA-256), writing and checking each line as a training dataset
// (worker/data/dataset.h JsonlRecordChecker) run side by side on threads of their own
// (server/piece_pipeline.h), at most 16 MiB behind what arrived (the client is held back
// beyond), so memory stays bounded whatever the file's size and a bad line ends the upload at
// once. After the client's last message (on the WorkPool): the stages finish, the file is
// fsynced, verified against the declared sha256 and size, and takes its name (<id>.jsonl,
// hard-linked so that an existing file is never replaced), and the record is stored (the
// storage quota checked again, atomically). A failure at any point removes what was written;
// temporary files a crash left are removed when the service starts. Uploads of one name at a
// time in a daemon (ABORTED for a second one meanwhile).
//
// What uploads may hold (issue 78): at most `max_concurrent_uploads` in progress at once, and
// `max_concurrent_uploads_per_project` of one project (its max_concurrent_uploads in the
// projects file overrides it); one more is RESOURCE_EXHAUSTED naming the limit, at its first
// message. A line longer than `max_line_bytes` is INVALID_ARGUMENT naming the line and
// uploads.max_line_bytes, as soon as that many bytes of it arrived. So an upload holds at most
// the pipeline's 16 MiB, plus the line being assembled, and what checking lines takes (about 5
// times a line, for each of its checking threads, and whole lines queued to them), whatever
// the file's size: bounded by a constant of max_line_bytes.
//
// Callers and projects as in JobService (server/auth.h): every handler begins with the one
// authorization step (server/authorization.h; an upload's with its first message, which names
// the project); a dataset of a project the caller may not act in is NOT_FOUND.
//
// Thread-safety: called concurrently by gRPC's threads.
#ifndef OOMB_SERVER_DATASET_SERVICE_H_
#define OOMB_SERVER_DATASET_SERVICE_H_

#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "oomb/v1/datasets.grpc.pb.h"
#include "server/auth.h"
#include "server/authorization.h"
#include "server/job_files.h"
#include "server/projects.h"
#include "server/store/job_store.h"
#include "server/work_pool.h"

namespace oomb::server {

struct DatasetServiceOptions {
  const Authorizer* authorizer = nullptr;           // the authorization step; required
  const Authenticator* auth = nullptr;              // Dataset.creator without a user; null: the peer
  std::shared_ptr<const ProjectRegistry> projects;  // max_storage_bytes; null: no quotas
  std::shared_ptr<const JobFiles> files;            // required
  WorkPool* work = nullptr;                         // the checks of finished uploads; null: inline
  int64_t max_concurrent_uploads = 8;               // uploads.max_concurrent
  int64_t max_concurrent_uploads_per_project = 2;   // uploads.max_concurrent_per_project
  size_t max_line_bytes = size_t{16} << 20;         // uploads.max_line_bytes
};

class DatasetServiceImpl final : public v1::DatasetService::CallbackService {
 public:
  DatasetServiceImpl(JobStore* store, DatasetServiceOptions options);

  // Removes the temporary files interrupted uploads left (a crash) in every project's directory.
  void RemovePartialUploads() const;

  grpc::ServerReadReactor<v1::UploadDatasetRequest>* UploadDataset(grpc::CallbackServerContext* ctx,
                                                                   v1::Dataset* resp) override;
  grpc::ServerUnaryReactor* GetDataset(grpc::CallbackServerContext* ctx, const v1::GetDatasetRequest* req,
                                       v1::Dataset* resp) override;
  grpc::ServerUnaryReactor* ListDatasets(grpc::CallbackServerContext* ctx, const v1::ListDatasetsRequest* req,
                                         v1::ListDatasetsResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteDataset(grpc::CallbackServerContext* ctx, const v1::DeleteDatasetRequest* req,
                                          v1::DeleteDatasetResponse* resp) override;

 private:
  class Upload;
  // The authorization step (options_.authorizer) for the call `ctx` of the method taking `request`.
  absl::StatusOr<Authorization> Authorize(const grpc::CallbackServerContext* ctx,
                                          const google::protobuf::Message& request) const;
  // Dataset.creator without a user: the caller's address (Authenticator::ClientIdentity).
  std::string ClientIdentity(const grpc::CallbackServerContext* ctx) const;
  // Marks `name` (of `project`) as being uploaded: ABORTED when it already is,
  // RESOURCE_EXHAUSTED when the uploads in progress are at a limit.
  absl::Status BeginUpload(const std::string& project, const std::string& name);
  void EndUpload(const std::string& project, const std::string& name);

  JobStore* const store_;
  const DatasetServiceOptions options_;
  absl::Mutex mu_;
  std::set<std::string> uploading_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> uploading_by_project_ ABSL_GUARDED_BY(mu_);
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_DATASET_SERVICE_H_
