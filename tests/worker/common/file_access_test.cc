// FileAccess (worker/common/file_access.h): every attack is performed on the real filesystem:
// links placed and swapped, FIFOs, directories where files belong, `..`, excluded subtrees.
// Each test runs under openat2(2) and under the per-component walk older kernels take.
#include "worker/common/file_access.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "worker/common/status.h"

namespace oomb {
namespace {

namespace fs = std::filesystem;

class FileAccessTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    base_ = fs::temp_directory_path() / ("oomb_file_access_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(base_);
    fs::create_directories(root() / "model");
    fs::create_directories(outside());
    fs::create_directories(data_dir() / "jobs" / "a");
    Write(root() / "model" / "config.json", "{}");
    Write(outside() / "secret", "the secret");
    ::chmod((outside() / "secret").c_str(), 0600);
    Write(data_dir() / "oombd.db", "the store");
    auto access =
        FileAccess::Create({.roots = {root().string()}, .excluded = {data_dir().string()}, .openat2 = GetParam()});
    ASSERT_TRUE(access.ok()) << access.status();
    access_ = *access;
  }
  void TearDown() override { fs::remove_all(base_); }

  static void Write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }
  fs::path root() const { return base_ / "root"; }
  fs::path outside() const { return base_ / "outside"; }
  fs::path data_dir() const { return root() / "data"; }  // inside the root, as ~/.local/share/oomb is in ~

  fs::path base_;
  std::shared_ptr<const FileAccess> access_;
};

TEST_P(FileAccessTest, OpensRegularFilesBeneathTheRoot) {
  auto f = access_->OpenFile((root() / "model" / "config.json").string());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*f->ReadAll(), "{}");
  auto d = access_->OpenDir((root() / "model").string());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d->ReadFile("config.json"), "{}");
}

TEST_P(FileAccessTest, RefusesPathsOutsideTheRootsAndDotDotEscapes) {
  auto f = access_->OpenFile((outside() / "secret").string());
  EXPECT_TRUE(absl::IsPermissionDenied(f.status())) << f.status();
  f = access_->OpenFile((root() / ".." / "outside" / "secret").string());
  EXPECT_TRUE(absl::IsPermissionDenied(f.status())) << f.status();
  EXPECT_TRUE(absl::IsInvalidArgument(access_->OpenFile("relative/path").status()));
}

TEST_P(FileAccessTest, NeverFollowsALinkPlacedInsideTheRoot) {
  // A link in a model directory to a 0600 file outside (issue 36, item 1).
  fs::create_symlink(outside() / "secret", root() / "model" / "tokenizer.json");
  auto d = access_->OpenDir((root() / "model").string());
  ASSERT_TRUE(d.ok());
  auto read = d->ReadFile("tokenizer.json");
  EXPECT_TRUE(absl::IsPermissionDenied(read.status())) << read.status();
  EXPECT_NE(read.status().message().find("symbolic link"), std::string::npos);
  auto f = access_->OpenFile((root() / "model" / "tokenizer.json").string());
  EXPECT_TRUE(absl::IsPermissionDenied(f.status())) << f.status();
  // A link that stays inside the root is refused all the same.
  fs::create_symlink(root() / "model" / "config.json", root() / "model" / "inside.json");
  EXPECT_TRUE(absl::IsPermissionDenied(d->ReadFile("inside.json").status()));
}

TEST_P(FileAccessTest, RefusesALinkAsADirectoryComponent) {
  fs::create_directories(outside() / "models");
  Write(outside() / "models" / "config.json", "outside");
  fs::create_directory_symlink(outside() / "models", root() / "linked");
  auto f = access_->OpenFile((root() / "linked" / "config.json").string());
  EXPECT_TRUE(absl::IsPermissionDenied(f.status())) << f.status();
  EXPECT_TRUE(absl::IsPermissionDenied(access_->OpenDir((root() / "linked").string()).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(access_->MakeDirs((root() / "linked" / "ck").string()).status()));
  EXPECT_FALSE(fs::exists(outside() / "models" / "ck"));
}

TEST_P(FileAccessTest, ADirOpenedBeforeItsPathIsSwappedStaysTheDirectoryChecked) {
  // The path is replaced with a link after the open (issue 36, item 2): writes stay inside.
  auto d = access_->MakeDirs((root() / "ck").string());
  ASSERT_TRUE(d.ok()) << d.status();
  fs::rename(root() / "ck", root() / "ck-moved");
  fs::create_directory_symlink(outside(), root() / "ck");
  ASSERT_TRUE(d->WriteFileAtomic("adapter.json", "{}").ok());
  EXPECT_TRUE(fs::exists(root() / "ck-moved" / "adapter.json"));
  EXPECT_FALSE(fs::exists(outside() / "adapter.json"));
  // A fresh open of the swapped path is refused.
  EXPECT_TRUE(absl::IsPermissionDenied(access_->OpenDir((root() / "ck").string()).status()));
}

TEST_P(FileAccessTest, RefusesFifosDevicesAndDirectoriesWithoutBlocking) {
  ASSERT_EQ(::mkfifo((root() / "fifo.jsonl").c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  auto f = access_->OpenFile((root() / "fifo.jsonl").string());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(absl::IsInvalidArgument(f.status())) << f.status();
  EXPECT_NE(f.status().message().find("a FIFO"), std::string::npos) << f.status();
  auto dir = access_->OpenFile((root() / "model").string());
  EXPECT_TRUE(absl::IsInvalidArgument(dir.status())) << dir.status();
  auto dev = FileAccess::Unconfined()->OpenFile("/dev/null");
  EXPECT_TRUE(absl::IsInvalidArgument(dev.status())) << dev.status();
  auto not_dir = access_->OpenDir((root() / "model" / "config.json").string());
  EXPECT_TRUE(absl::IsInvalidArgument(not_dir.status())) << not_dir.status();
}

TEST_P(FileAccessTest, RefusesTheExcludedDataDirEvenBeneathARoot) {
  // The daemon's own store as a dataset (issue 36, item 3).
  auto f = access_->OpenFile((data_dir() / "oombd.db").string());
  EXPECT_TRUE(absl::IsPermissionDenied(f.status())) << f.status();
  EXPECT_NE(f.status().message().find("data directory"), std::string::npos);
  EXPECT_TRUE(absl::IsPermissionDenied(access_->OpenDir(data_dir().string()).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(access_->MakeDirs((data_dir() / "jobs" / "b").string()).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(access_->CheckPath((data_dir() / "x" / ".." / "oombd.db").string())));
  // A sibling whose name merely starts with the data dir's is not inside it.
  fs::create_directories(root() / "data2");
  EXPECT_TRUE(access_->MakeDirs((root() / "data2" / "ck").string()).ok());
}

// A root granted inside the excluded data dir (an uploaded dataset's directory) opens what lies
// beneath it, and nothing else of the data dir: not its store, not a sibling, not by `..`.
TEST_P(FileAccessTest, ARootGrantedInsideTheDataDirOpensOnlyWhatIsBeneathIt) {
  fs::create_directories(data_dir() / "datasets" / "nlp");
  Write(data_dir() / "datasets" / "nlp" / "a.jsonl", "{}\n");
  fs::create_directories(data_dir() / "datasets" / "vision");
  Write(data_dir() / "datasets" / "vision" / "b.jsonl", "{}\n");
  auto granted = FileAccess::Create({.roots = {root().string(), (data_dir() / "datasets" / "nlp").string()},
                                     .excluded = {data_dir().string()},
                                     .openat2 = GetParam()});
  ASSERT_TRUE(granted.ok()) << granted.status();
  EXPECT_TRUE((*granted)->OpenFile((data_dir() / "datasets" / "nlp" / "a.jsonl").string()).ok());
  for (const fs::path& p : {data_dir() / "oombd.db", data_dir() / "datasets" / "vision" / "b.jsonl",
                            data_dir() / "datasets" / "nlp" / ".." / "vision" / "b.jsonl"}) {
    const auto f = (*granted)->OpenFile(p.string());
    EXPECT_TRUE(absl::IsPermissionDenied(f.status())) << p << ": " << f.status();
  }
  // A link placed in the granted directory is not followed out of it.
  fs::create_symlink(data_dir() / "oombd.db", data_dir() / "datasets" / "nlp" / "store.jsonl");
  EXPECT_FALSE((*granted)->OpenFile((data_dir() / "datasets" / "nlp" / "store.jsonl").string()).ok());
}

TEST_P(FileAccessTest, DirOperationsUseSingleNamesAndNeverFollowLinks) {
  auto d = access_->MakeDirs((root() / "out" / "deep").string());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(absl::IsInvalidArgument(d->WriteFileAtomic("../escape", "x")));
  EXPECT_TRUE(absl::IsInvalidArgument(d->OpenFile("..").status()));
  ASSERT_TRUE(d->WriteFileAtomic("a.json", "1").ok());
  ASSERT_TRUE(d->WriteFileAtomic("a.json", "2").ok());
  EXPECT_EQ(*d->ReadFile("a.json"), "2");
  EXPECT_TRUE(absl::IsAlreadyExists(d->CreateExclusive("a.json", "3")));
  // A link planted among the outputs is removed, its target kept.
  fs::create_directory_symlink(outside(), root() / "out" / "deep" / "checkpoint-1");
  ASSERT_TRUE(d->RemoveTree("checkpoint-1").ok());
  EXPECT_TRUE(fs::exists(outside() / "secret"));
  EXPECT_TRUE(absl::IsPermissionDenied(d->OpenDir("a.json").status()) ||
              absl::IsInvalidArgument(d->OpenDir("a.json").status()));
  auto sub = d->MakeDir("checkpoint-2");
  ASSERT_TRUE(sub.ok());
  ASSERT_TRUE(sub->WriteFileAtomic("x", "y").ok());
  ASSERT_TRUE(d->RemoveTree("checkpoint-2").ok());
  EXPECT_FALSE(d->Contains("checkpoint-2"));
  auto entries = d->List();
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ((*entries)[0].name, "a.json");
}

TEST_P(FileAccessTest, RootsMayBeNamedThroughALinkToThem) {
  fs::create_directory_symlink(root(), base_ / "root-link");
  auto access = FileAccess::Create({.roots = {(base_ / "root-link").string()}, .excluded = {}, .openat2 = GetParam()});
  ASSERT_TRUE(access.ok());
  EXPECT_TRUE((*access)->OpenFile((base_ / "root-link" / "model" / "config.json").string()).ok());
  EXPECT_TRUE((*access)->OpenFile((root() / "model" / "config.json").string()).ok());
}

TEST_P(FileAccessTest, UnconfinedAccessFollowsLinksButOpensOnlyRegularFiles) {
  fs::create_symlink(outside() / "secret", root() / "model" / "tokenizer.json");
  auto d = FileAccess::Unconfined()->OpenDir((root() / "model").string());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d->ReadFile("tokenizer.json"), "the secret");
  ASSERT_EQ(::mkfifo((root() / "fifo").c_str(), 0600), 0);
  EXPECT_TRUE(absl::IsInvalidArgument(FileAccess::Unconfined()->OpenFile((root() / "fifo").string()).status()));
}

TEST_P(FileAccessTest, AFullDiskIsResourceExhaustedWithItsReason) {
  const absl::Status s = ErrnoStatus(ENOSPC, "write", "/x");
  EXPECT_TRUE(absl::IsResourceExhausted(s));
  EXPECT_EQ(ReasonOf(s), Reason::kDiskFull);
  EXPECT_FALSE(IsRetryable(s));
}

INSTANTIATE_TEST_SUITE_P(Resolution, FileAccessTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "openat2" : "walk"; });

TEST(StatusTest, ReasonsTravelAsPayloadsThroughAnnotate) {
  const absl::Status s = Annotate(WithReason(absl::InternalError("loss is nan"), Reason::kNanLoss), "step 7");
  EXPECT_EQ(s.message(), "step 7: loss is nan");
  EXPECT_EQ(ReasonOf(s), Reason::kNanLoss);
  EXPECT_FALSE(IsRetryable(s));  // INTERNAL, but the reason says a retry gives the same NaN
  EXPECT_TRUE(IsRetryable(absl::InternalError("no reason")));
  EXPECT_TRUE(IsRetryable(WithReason(absl::InternalError("x"), Reason::kCudaError)));
  EXPECT_FALSE(IsRetryable(WithReason(absl::ResourceExhaustedError("x"), Reason::kDoesNotFit)));
  EXPECT_EQ(ReasonName(Reason::kCheckpointDirTaken), "CHECKPOINT_DIR_TAKEN");
  EXPECT_EQ(ParseReason("BAD_DATA"), Reason::kBadData);
}

TEST(StatusTest, ExcerptsAndBoundedMessagesAreShortPrintableAndValidUtf8) {
  const std::string huge = "{\"text\": \"" + std::string(200 << 20, 'a');
  const std::string e = Excerpt(huge, 80);
  EXPECT_LE(e.size(), 80u);
  EXPECT_NE(e.find("more bytes)"), std::string::npos);
  EXPECT_EQ(Excerpt("a\nb\x01\xff", 80), "a\\nb\\x01\\xff");
  const absl::Status b = Bounded(WithReason(absl::InvalidArgumentError(huge), Reason::kBadData));
  EXPECT_LE(b.message().size(), kMaxMessageBytes);
  EXPECT_EQ(ReasonOf(b), Reason::kBadData);
  EXPECT_TRUE(absl::IsInvalidArgument(b));
  // Cutting never splits a UTF-8 sequence.
  std::string accents;
  for (int i = 0; i < 1000; ++i) accents += "\xc3\xa9";
  const std::string cut = BoundedText(accents, 101);
  for (size_t i = 0; i < cut.size();) {
    if (static_cast<unsigned char>(cut[i]) < 0x80) {
      ++i;
      continue;
    }
    ASSERT_EQ(cut.substr(i, 2), "\xc3\xa9");
    i += 2;
  }
  EXPECT_EQ(BoundedText("short"), "short");
}

}  // namespace
}  // namespace oomb
