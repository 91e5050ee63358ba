// Issue 78, item 5, performed for real against the real daemon on loopback through its gRPC
// DatasetService: concurrent uploads are bounded per project (uploads.max_concurrent_per_project,
// a project's max_concurrent_uploads in the projects file) and in total (uploads.max_concurrent),
// one more refused with RESOURCE_EXHAUSTED naming the limit; and what checking an upload holds
// is bounded by a constant per upload, whatever its lines: eight concurrent uploads of a
// 20 MB single-line dataset (the attack, smaller) are refused naming the line and
// uploads.max_line_bytes, and the daemon's peak RSS grows by less than a bound per upload that
// checking a whole 20 MB line would pass. (bench/upload_memory.sh measures 8 x 250 MB.)
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "oomb/v1/datasets.grpc.pb.h"
#include "tests/client/daemon_harness.h"

namespace oomb::testing {
namespace {

using ::testing::HasSubstr;

// One upload as a client stream, held open between its messages.
class Upload {
 public:
  Upload(v1::DatasetService::Stub* stub, const std::string& project, const std::string& id) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    writer_ = stub->UploadDataset(&ctx_, &dataset_);
    first_.set_parent("projects/" + project);
    first_.set_dataset_id(id);
  }
  // Sends `bytes` (the first call with parent and id); false once the server has ended the call.
  bool Send(const std::string& bytes) {
    v1::UploadDatasetRequest m = sent_ ? v1::UploadDatasetRequest() : first_;
    sent_ = true;
    m.set_data(bytes);
    return writer_->Write(m);
  }
  grpc::Status Finish() {
    writer_->WritesDone();
    return writer_->Finish();
  }

 private:
  grpc::ClientContext ctx_;
  v1::Dataset dataset_;
  v1::UploadDatasetRequest first_;
  bool sent_ = false;
  std::unique_ptr<grpc::ClientWriter<v1::UploadDatasetRequest>> writer_;
};

constexpr char kLine[] = "{\"text\": \"a line of a dataset\"}\n";

class UploadLimitsTest : public ::testing::Test {
 protected:
  // `projects_yaml`: a tenancy.projects_file's text, when not empty.
  void Start(std::vector<std::string> extra, const std::string& projects_yaml = "") {
    tmp_ = std::make_unique<TempDir>();
    DaemonOptions o;
    o.extra = std::move(extra);
    if (!projects_yaml.empty()) {
      WriteFile(tmp_->path() / "projects.yaml", projects_yaml);
      o.extra.insert(o.extra.end(), {"--set", "tenancy.projects_file=" + (tmp_->path() / "projects.yaml").string()});
    }
    daemon_ = std::make_unique<Daemon>(tmp_->path() / "data", o);
    ASSERT_GT(daemon_->port(), 0) << daemon_->log();
    channel_ = grpc::CreateChannel(daemon_->tcp_endpoint(), grpc::InsecureChannelCredentials());
    stub_ = v1::DatasetService::NewStub(channel_);
  }
  // The uploads of `project` the daemon has begun (their temporary files).
  int InProgress(const std::string& project) const {
    const fs::path dir = tmp_->path() / "data" / "datasets" / project;
    int n = 0;
    std::error_code ec;
    for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      n += it->path().filename().string().rfind(".upload-", 0) == 0;
    }
    return n;
  }
  // An upload begun and held open: its first message sent and its temporary file made.
  std::unique_ptr<Upload> Hold(const std::string& project, const std::string& id) {
    const int before = InProgress(project);
    auto u = std::make_unique<Upload>(stub_.get(), project, id);
    EXPECT_TRUE(u->Send(kLine));
    EXPECT_TRUE(WaitFor([&] { return InProgress(project) == before + 1; }, std::chrono::seconds(20)))
        << project << "/" << id << " did not begin";
    return u;
  }
  grpc::Status Refused(const std::string& project, const std::string& id) {
    Upload u(stub_.get(), project, id);
    u.Send(kLine);
    return u.Finish();
  }

  std::unique_ptr<TempDir> tmp_;
  std::unique_ptr<Daemon> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::DatasetService::Stub> stub_;
};

TEST_F(UploadLimitsTest, ConcurrentUploadsAreBoundedPerProjectAndInTotal) {
  Start({"--set", "uploads.max_concurrent=3", "--set", "uploads.max_concurrent_per_project=2"},
        "projects:\n  c: {max_concurrent_uploads: 1}\n");
  auto a1 = Hold("a", "one"), a2 = Hold("a", "two");
  grpc::Status s = Refused("a", "three");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(),
              HasSubstr("project a has 2 uploads in progress, its limit (uploads.max_concurrent_per_project 2)"));
  auto c1 = Hold("c", "one");
  s = Refused("c", "two");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("its limit (max_concurrent_uploads in tenancy.projects_file 1)"));
  s = Refused("b", "one");  // b has none, but the daemon holds 3
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(),
              HasSubstr("the daemon has 3 uploads in progress, its limit (uploads.max_concurrent 3)"));
  // The refused ones left nothing; an upload that ends makes room for one more.
  EXPECT_EQ(InProgress("a"), 2);
  EXPECT_FALSE(fs::exists(tmp_->path() / "data" / "datasets" / "a" / "three.jsonl"));
  ASSERT_TRUE(a1->Send(kLine));
  s = a1->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
  auto b1 = Hold("b", "one");
  for (Upload* u : {a2.get(), c1.get(), b1.get()}) {
    s = u->Finish();
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  // Every slot is free again: two of a at once.
  auto a3 = Hold("a", "three"), a4 = Hold("a", "four");
  EXPECT_TRUE(a3->Finish().ok());
  EXPECT_TRUE(a4->Finish().ok());
}

TEST_F(UploadLimitsTest, ConcurrentSingleLineUploadsAreRefusedInBoundedMemory) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  constexpr int64_t kMaxLine = 2 * kMiB;
  Start({"--set", "uploads.max_line_bytes=" + std::to_string(kMaxLine)});
  constexpr int kUploads = 8;
  constexpr int64_t kBytes = 20 * kMiB;
  const int64_t before = daemon_->PeakRssBytes();
  ASSERT_GT(before, 0);
  std::vector<grpc::Status> results(kUploads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kUploads; ++i) {
    threads.emplace_back([&, i] {
      // Four projects, two uploads each (the default per-project limit), eight in all.
      Upload u(stub_.get(), "p" + std::to_string(i / 2), "line" + std::to_string(i));
      const std::string piece(kMiB, 'x');
      bool open = u.Send("{\"text\": \"");
      for (int64_t sent = 0; open && sent < kBytes; sent += kMiB) open = u.Send(piece);
      if (open) u.Send("\"}\n");
      results[i] = u.Finish();
    });
  }
  for (std::thread& t : threads) t.join();
  for (const grpc::Status& s : results) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(":1: the line is longer than 2097152 bytes (uploads.max_line_bytes)"));
  }
  // Per upload: the pipeline's 16 MiB behind what arrived, the line being assembled and the
  // check's copies of it (about 5 x 2 MiB), gRPC's buffers. Checking a whole 20 MB line takes
  // about 100 MB an upload, 800 MB for the eight.
  const int64_t growth = daemon_->PeakRssBytes() - before;
  EXPECT_LT(growth, kUploads * 40 * kMiB) << "peak RSS grew by " << growth / kMiB << " MiB";
  // The same bytes as lines the limit allows are accepted.
  Upload ok(stub_.get(), "p0", "lines");
  std::string block;
  while (block.size() < kMiB) block += kLine;
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(ok.Send(block));
  const grpc::Status s = ok.Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
}

}  // namespace
}  // namespace oomb::testing
