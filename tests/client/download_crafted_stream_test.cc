// Issue 78's low finding, performed for real: the real `oomb download` against a malicious
// server on loopback (a JobService of this test's own) whose DownloadCheckpoint names the archive
// root "../escape" and then holds the stream open. The CLI wrote inside --dir and never exited;
// it must refuse the root, write nothing, and exit non-zero at once. A server that holds a
// well-formed archive's stream open after its end is not waited for either.
#include <archive.h>
#include <archive_entry.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "oomb/v1/jobs.grpc.pb.h"
#include "tests/client/daemon_harness.h"

namespace oomb::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kContent[] = "{\"r\": 8}\n";

// A ustar archive of `root`/ and `root`/adapter_config.json, as the daemon's archives are laid out.
std::string Tar(const std::string& root) {
  std::unique_ptr<struct archive, decltype(&archive_write_free)> a(archive_write_new(), archive_write_free);
  archive_write_set_format_ustar(a.get());
  archive_write_set_bytes_in_last_block(a.get(), 1);
  std::string out(1 << 20, '\0');
  size_t used = 0;
  EXPECT_EQ(archive_write_open_memory(a.get(), out.data(), out.size(), &used), ARCHIVE_OK);
  std::unique_ptr<struct archive_entry, decltype(&archive_entry_free)> e(archive_entry_new(), archive_entry_free);
  archive_entry_set_pathname(e.get(), (root + "/").c_str());
  archive_entry_set_filetype(e.get(), AE_IFDIR);
  archive_entry_set_perm(e.get(), 0755);
  archive_write_header(a.get(), e.get());
  archive_entry_clear(e.get());
  archive_entry_set_pathname(e.get(), (root + "/adapter_config.json").c_str());
  archive_entry_set_filetype(e.get(), AE_IFREG);
  archive_entry_set_perm(e.get(), 0644);
  archive_entry_set_size(e.get(), static_cast<la_int64_t>(sizeof(kContent) - 1));
  archive_write_header(a.get(), e.get());
  archive_write_data(a.get(), kContent, sizeof(kContent) - 1);
  archive_write_close(a.get());
  out.resize(used);
  return out;
}

// Serves one crafted archive under `root`, then holds the stream until the client goes.
class CraftedServer final : public v1::JobService::Service {
 public:
  explicit CraftedServer(std::string root) : root_(std::move(root)) {}
  grpc::Status DownloadCheckpoint(grpc::ServerContext* ctx, const v1::DownloadCheckpointRequest* req,
                                  grpc::ServerWriter<v1::DownloadCheckpointResponse>* writer) override {
    const std::string tar = Tar(root_);
    v1::DownloadCheckpointResponse first;
    v1::CheckpointArchive* archive = first.mutable_archive();
    archive->set_name(req->name());
    archive->set_root(root_);
    archive->set_total_bytes(static_cast<int64_t>(tar.size()));
    archive->set_etag("crafted");
    v1::CheckpointArchive::File* f = archive->add_files();
    f->set_path("adapter_config.json");
    f->set_size(sizeof(kContent) - 1);
    f->set_crc32(static_cast<uint32_t>(
        crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(kContent), sizeof(kContent) - 1)));
    writer->Write(first);
    v1::DownloadCheckpointResponse data;
    data.set_data(tar);
    writer->Write(data);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!ctx->IsCancelled() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return grpc::Status::OK;
  }

 private:
  const std::string root_;
};

struct Served {
  explicit Served(const std::string& root) : service(root) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service);
    server = b.BuildAndStart();
  }
  ~Served() { server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1)); }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port); }
  CraftedServer service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

TEST(DownloadCraftedStreamTest, AnArchiveRootOutsideDirIsRefusedAndTheCliExits) {
  TempDir tmp;
  Served server("../escape");
  ASSERT_GT(server.port, 0);
  const fs::path dir = tmp.path() / "a" / "dl";
  fs::create_directories(dir);
  const auto start = std::chrono::steady_clock::now();
  // `timeout` turns a hang into rc 124 instead of a test stuck for ctest's limit.
  const Result r = Shell("timeout 30 " + OombCli() + " --endpoint " + server.endpoint() +
                             " download projects/p/jobs/j --dir " + dir.string(),
                         tmp.path());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.rc, 124) << "the CLI did not exit";
  EXPECT_THAT(r.err, HasSubstr("the server's archive root '../escape' is not a directory name"));
  EXPECT_FALSE(fs::exists(dir / "adapter_config.json"));
  EXPECT_FALSE(fs::exists(tmp.path() / "a" / "escape"));
  EXPECT_FALSE(fs::exists(tmp.path() / "a" / "escape" / "adapter_config.json"));
}

TEST(DownloadCraftedStreamTest, AStreamHeldOpenAfterACompleteArchiveIsNotWaitedFor) {
  TempDir tmp;
  Served server("final");
  ASSERT_GT(server.port, 0);
  const fs::path dir = tmp.path() / "dl";
  const Result r = Shell("timeout 30 " + OombCli() + " --endpoint " + server.endpoint() +
                             " download projects/p/jobs/j --dir " + dir.string(),
                         tmp.path());
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(Slurp(dir / "adapter_config.json"), kContent);
  EXPECT_FALSE(fs::exists(dir / ".oomb-download"));
}

}  // namespace
}  // namespace oomb::testing
