// Data in, models out: `oomb datasets upload|list|get|delete` and `oomb download`.
//
// upload: the file's SHA-256 and size are sent with it, so the server refuses what arrives
// damaged; the id defaults to "ds-" and the first 12 hex digits of the SHA-256 (hashed before
// sending), so an upload retried after a lost answer finds the same dataset instead of making a
// second one; with --id the file is hashed as it is sent (the hash in a last message).
//
// download: the checkpoint's tar stream (DownloadCheckpoint) is unpacked into DIR as it arrives
// (its files flat, as the checkpoint directory holds them; each written to .NAME.part, its CRC-32
// checked against the checkpoint's manifest, fsynced, then renamed), so every byte is written
// once. DIR/.oomb-download keeps the archive's etag and the offset of the first entry not yet
// unpacked: a stream cut off (the server restarting, the network) resumes from that entry, by
// this run (a few attempts, with backoff) or by running the command again.
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <archive.h>
#include <archive_entry.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "client/commands.h"

namespace oomb::client {
namespace {

namespace fs = std::filesystem;

constexpr size_t kChunk = size_t{1} << 20;
constexpr la_int64_t kWritebackBytes = la_int64_t{8} << 20;

bool Tty() { return ::isatty(STDERR_FILENO) != 0; }

// SHA-256, fed piece by piece.
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) { EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr); }
  void Update(const char* data, size_t n) { EVP_DigestUpdate(ctx_.get(), data, n); }
  std::string Hex() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx_.get(), digest, &len);
    return absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(digest), len));
  }

 private:
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx_;
};

// The SHA-256 (hex) and size of a file; an error message when it cannot be read.
bool HashFile(const std::string& path, std::string* sha, int64_t* size, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = path + ": cannot be read";
    return false;
  }
  Sha256 hash;
  std::string buf(kChunk, '\0');
  *size = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = in.gcount();
    if (n <= 0) break;
    hash.Update(buf.data(), static_cast<size_t>(n));
    *size += n;
  }
  *sha = hash.Hex();
  return true;
}

// Streams the file after `first` (its fields, with the first bytes), hashing it on the way when
// `hash` is given; false when the server ended the stream early (Finish says why).
bool SendFile(grpc::ClientWriter<v1::UploadDatasetRequest>& writer, const v1::UploadDatasetRequest& first,
              const std::string& path, int64_t size, Sha256* hash) {
  std::ifstream in(path, std::ios::binary);
  v1::UploadDatasetRequest m = first;
  int64_t sent = 0;
  bool open = true;
  while (open && in) {
    std::string* data = m.mutable_data();  // read into the message: no copy
    data->resize(kChunk);
    in.read(data->data(), static_cast<std::streamsize>(kChunk));
    const std::streamsize n = in.gcount();
    if (n <= 0) break;
    data->resize(static_cast<size_t>(n));
    if (hash != nullptr) hash->Update(data->data(), data->size());
    open = writer.Write(m);
    m.Clear();
    sent += n;
    if (Tty()) std::cerr << fmt::format("\ruploading {}: {} of {}", path, Bytes(sent), Bytes(size)) << std::flush;
  }
  if (open && sent == 0) open = writer.Write(first);  // an empty file: the server says what is wrong with it
  if (open && hash != nullptr) {
    v1::UploadDatasetRequest last;
    last.set_sha256(hash->Hex());
    open = writer.Write(last);
  }
  return open;
}

// A dataset's name from what a user typed: a full name as it is, "datasets/x" or an id as
// "projects/{--project}/datasets/{id}" (or "datasets/{id}": the server's default project).
std::string DatasetName(const Globals& g, const std::string& arg) {
  if (arg.rfind("projects/", 0) == 0) return arg;
  const std::string id = arg.rfind("datasets/", 0) == 0 ? arg.substr(9) : arg;
  return g.project.empty() ? "datasets/" + id : "projects/" + g.project + "/datasets/" + id;
}

void PrintDataset(const v1::Dataset& d) {
  std::cout << fmt::format("name:     {}\n", d.name());
  if (!d.display_name().empty()) std::cout << fmt::format("display:  {}\n", Printable(d.display_name()));
  std::cout << fmt::format("size:     {} ({} bytes)\n", Bytes(d.size_bytes()), d.size_bytes());
  std::cout << fmt::format("sha256:   {}\n", d.sha256());
  std::string kinds;
  for (const auto& [k, n] : std::map<std::string, int64_t>(d.record_kinds().begin(), d.record_kinds().end())) {
    kinds += fmt::format("{}{} {}", kinds.empty() ? "" : ", ", n, k);
  }
  std::cout << fmt::format("records:  {} ({})\n", d.records(), kinds);
  std::cout << fmt::format("created:  {} by {}\n", Time(d.create_time()), d.creator());
}

void AddUpload(CLI::App& datasets, const Cli& cli) {
  struct Args {
    std::string file, id, display_name;
  };
  auto a = std::make_shared<Args>();
  auto* up = datasets.add_subcommand("upload", "Upload a JSONL dataset; jobs name it as datasets/{id}")
                 ->footer(
                     "Examples:\n  oomb datasets upload train.jsonl\n"
                     "  oomb datasets upload train.jsonl --id austen --project nlp");
  up->add_option("file", a->file, "The JSONL file")->required();
  up->add_option("--id", a->id, "The dataset's id (default: ds- and the start of its SHA-256)");
  up->add_option("--display-name", a->display_name, "A name for people");
  OnRun(up, [cli, a] {
    // The default id is made of the SHA-256: hashed first. A named upload hashes the file as it
    // sends it (the hash in a last message), reading it once.
    const bool hash_first = a->id.empty();
    std::string sha, error;
    int64_t size = 0;
    std::ifstream readable(a->file, std::ios::binary);
    if (!readable) error = a->file + ": cannot be read";
    if (hash_first && error.empty()) HashFile(a->file, &sha, &size, &error);
    std::error_code ec;
    if (!hash_first && error.empty()) size = static_cast<int64_t>(fs::file_size(a->file, ec));
    if (!error.empty() || ec) {
      std::cerr << "oomb: error: " << (error.empty() ? a->file + ": " + ec.message() : error) << "\n";
      return int{kError};
    }
    v1::UploadDatasetRequest first;
    first.set_parent(Parent(cli.globals));
    first.set_dataset_id(hash_first ? "ds-" + sha.substr(0, 12) : a->id);
    first.set_display_name(a->display_name.empty() ? fs::path(a->file).filename().string() : a->display_name);
    first.set_sha256(sha);
    first.set_size_bytes(size);
    v1::Dataset dataset;
    std::unique_ptr<grpc::ClientContext> ctx = cli.client().Context(/*unary=*/false);
    std::unique_ptr<grpc::ClientWriter<v1::UploadDatasetRequest>> writer =
        cli.client().datasets().UploadDataset(ctx.get(), &dataset);
    Sha256 hash;
    SendFile(*writer, first, a->file, size, hash_first ? nullptr : &hash);
    writer->WritesDone();
    const grpc::Status s = writer->Finish();
    if (Tty()) std::cerr << "\n";
    if (!s.ok()) return Fail(s);
    if (!PrintStructured(cli.globals, dataset)) {
      std::cout << dataset.name() << "\n";
      std::cerr << fmt::format("{} records, {}; a job names it as data.train: datasets/{}\n", dataset.records(),
                               Bytes(dataset.size_bytes()), dataset.name().substr(dataset.name().rfind('/') + 1));
    }
    return 0;
  });
}

void AddDatasetQueries(CLI::App& datasets, const Cli& cli) {
  auto all = std::make_shared<bool>(false);
  auto* list = datasets.add_subcommand("list", "List uploaded datasets")->footer("Example:\n  oomb datasets list -A");
  list->add_flag("-A,--all-projects", *all, "Datasets of every project you may act in");
  OnRun(list, [cli, all] {
    v1::ListDatasetsRequest req;
    req.set_parent(*all ? "projects/-" : Parent(cli.globals));
    v1::ListDatasetsResponse out;
    for (;;) {
      v1::ListDatasetsResponse page;
      auto ctx = cli.client().Context();
      const grpc::Status s = cli.client().datasets().ListDatasets(ctx.get(), req, &page);
      if (!s.ok()) return Fail(s);
      for (v1::Dataset& d : *page.mutable_datasets()) *out.add_datasets() = std::move(d);
      if (page.next_page_token().empty()) break;
      req.set_page_token(page.next_page_token());
    }
    if (PrintStructured(cli.globals, out)) return 0;
    std::cout << fmt::format("{:<48} {:>10} {:>9} {:<19} {}\n", "NAME", "SIZE", "RECORDS", "CREATED", "DISPLAY_NAME");
    for (const v1::Dataset& d : out.datasets()) {
      std::cout << fmt::format("{:<48} {:>10} {:>9} {:<19} {}\n", d.name(), Bytes(d.size_bytes()), d.records(),
                               Time(d.create_time()), Printable(d.display_name()));
    }
    return 0;
  });
  auto name = std::make_shared<std::string>();
  auto* get =
      datasets.add_subcommand("get", "Show an uploaded dataset")->footer("Example:\n  oomb datasets get austen");
  get->add_option("dataset", *name, "Dataset id or name")->required();
  OnRun(get, [cli, name] {
    v1::GetDatasetRequest req;
    req.set_name(DatasetName(cli.globals, *name));
    v1::Dataset d;
    auto ctx = cli.client().Context();
    const grpc::Status s = cli.client().datasets().GetDataset(ctx.get(), req, &d);
    if (!s.ok()) return Fail(s);
    if (!PrintStructured(cli.globals, d)) PrintDataset(d);
    return 0;
  });
  auto del_name = std::make_shared<std::string>();
  auto* del = datasets.add_subcommand("delete", "Delete an uploaded dataset")
                  ->footer("Example:\n  oomb datasets delete austen");
  del->add_option("dataset", *del_name, "Dataset id or name")->required();
  OnRun(del, [cli, del_name] {
    v1::DeleteDatasetRequest req;
    req.set_name(DatasetName(cli.globals, *del_name));
    v1::DeleteDatasetResponse resp;
    auto ctx = cli.client().Context();
    const grpc::Status s = cli.client().datasets().DeleteDataset(ctx.get(), req, &resp);
    if (!s.ok()) return Fail(s);
    if (!PrintStructured(cli.globals, resp)) std::cout << "deleted " << req.name() << "\n";
    return 0;
  });
}

// One attempt's stream, handed to libarchive message by message (archive_read_open's callback):
// the archive's description comes first, then its bytes from the request's offset.
struct ArchiveStream {
  grpc::ClientReader<v1::DownloadCheckpointResponse>* reader = nullptr;
  v1::DownloadCheckpointResponse message;
  v1::CheckpointArchive archive;  // the first message's
  int64_t offset = 0;             // where the stream began in the archive
  int64_t received = 0;           // bytes of the archive received, from `offset`

  static la_ssize_t Read(struct archive* /*a*/, void* self, const void** buf) {
    auto* s = static_cast<ArchiveStream*>(self);
    while (s->reader->Read(&s->message)) {
      if (s->message.data().empty()) continue;
      *buf = s->message.data().data();
      s->received += static_cast<int64_t>(s->message.data().size());
      if (Tty() && s->archive.total_bytes() > 0) {
        std::cerr << fmt::format("\rdownloading {}: {} of {}", s->archive.name(), Bytes(s->offset + s->received),
                                 Bytes(s->archive.total_bytes()))
                  << std::flush;
      }
      return static_cast<la_ssize_t>(s->message.data().size());
    }
    return 0;  // the stream ended: its status comes from Finish
  }
};

// Where a download stands, kept in DIR/.oomb-download (the archive's etag, then the offset of the
// first entry not yet in DIR) so that a cut-off download resumes there, in this run or the next.
struct DownloadState {
  std::string etag;
  int64_t offset = 0;

  static DownloadState Load(const fs::path& file) {
    DownloadState st;
    std::ifstream in(file);
    if (!(in >> st.etag >> st.offset) || st.offset < 0) return {};
    return st;
  }
  void Save(const fs::path& file) const {
    const fs::path tmp = file.string() + ".tmp";
    std::ofstream(tmp) << etag << "\n" << offset << "\n";
    fs::rename(tmp, file);
  }
};

// Writes the entry libarchive is at into dir/name (through dir/.name.part, fsynced, renamed when
// its CRC-32 is the manifest's). False with `error` otherwise, the part removed.
bool WriteEntry(struct archive* a, const fs::path& dir, const std::string& name, uint32_t want_crc,
                std::string* error) {
  const fs::path tmp = dir / ("." + name + ".part");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = tmp.string() + ": cannot be written";
    return false;
  }
  uLong crc = crc32(0L, Z_NULL, 0);
  const void* block = nullptr;
  size_t size = 0;
  la_int64_t at = 0;
  int r = ARCHIVE_OK;
  bool written = true;
  la_int64_t flushed = 0;
  while ((r = archive_read_data_block(a, &block, &size, &at)) == ARCHIVE_OK && written) {
    crc = crc32(crc, static_cast<const Bytef*>(block), static_cast<uInt>(size));
    for (size_t done = 0; written && done < size;) {
      const ssize_t n = ::pwrite(fd, static_cast<const char*>(block) + done, size - done, at + done);
      written = n > 0 || (n < 0 && errno == EINTR);
      done += n > 0 ? static_cast<size_t>(n) : 0;
    }
    // Writeback starts as the bytes come (without waiting), so the fsync below has little left.
    if (at + static_cast<la_int64_t>(size) - flushed >= kWritebackBytes) {
      ::sync_file_range(fd, flushed, at + static_cast<la_int64_t>(size) - flushed, SYNC_FILE_RANGE_WRITE);
      flushed = at + static_cast<la_int64_t>(size);
    }
  }
  written = written && ::fsync(fd) == 0;
  ::close(fd);
  if (!written || r != ARCHIVE_EOF || (want_crc != 0 && static_cast<uint32_t>(crc) != want_crc)) {
    *error = !written           ? tmp.string() + ": write failed (disk full?)"
             : r != ARCHIVE_EOF ? std::string(archive_error_string(a) ? archive_error_string(a) : "read failed")
                                : fmt::format("{}: CRC-32 {:08x}, the checkpoint's manifest says {:08x}", name,
                                              static_cast<uint32_t>(crc), want_crc);
    fs::remove(tmp);
    return false;
  }
  fs::rename(tmp, dir / name);
  return true;
}

// Unpacks one attempt's stream into `dir` as it arrives (its top directory stripped, each file's
// CRC-32 checked), moving `state` to each entry it starts. False with `error` when an entry is
// not the checkpoint's or a file fails its check; a stream cut off returns false too, with
// libarchive's error, and the caller reads the stream's status.
bool UnpackStream(ArchiveStream& stream, const fs::path& dir, DownloadState& state, const fs::path& state_file,
                  std::string* error) {
  std::map<std::string, uint32_t> crcs;
  for (const auto& f : stream.archive.files()) crcs[f.path()] = f.crc32();
  std::unique_ptr<struct archive, decltype(&archive_read_free)> a(archive_read_new(), archive_read_free);
  archive_read_support_format_tar(a.get());
  if (archive_read_open(a.get(), &stream, nullptr, &ArchiveStream::Read, nullptr) != ARCHIVE_OK) {
    *error = archive_error_string(a.get());
    return false;
  }
  const std::string& root = stream.archive.root();
  // The checkpoint's own directory name ("final", "checkpoint-<step>"): a root such as
  // "../escape" or "a/b" is not the daemon's, and nothing of such an archive is written.
  if (root.empty() || root == "." || root == ".." || root.find_first_of("/\\") != std::string::npos ||
      std::any_of(root.begin(), root.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; })) {
    *error = "the server's archive root '" + absl::CEscape(root) + "' is not a directory name; nothing was written";
    return false;
  }
  const std::string prefix = root + "/";
  struct archive_entry* e = nullptr;
  int r = ARCHIVE_OK;
  while ((r = archive_read_next_header(a.get(), &e)) == ARCHIVE_OK) {
    state.offset = stream.offset + archive_read_header_position(a.get());
    state.Save(state_file);
    const std::string path = archive_entry_pathname(e);
    if (path == prefix) continue;
    const std::string name = path.rfind(prefix, 0) == 0 ? path.substr(prefix.size()) : "";
    if (name.empty() || name.find('/') != std::string::npos || name == ".." || !crcs.count(name) ||
        archive_entry_filetype(e) != AE_IFREG) {
      *error = "unexpected entry in the archive: " + path;
      return false;
    }
    if (!WriteEntry(a.get(), dir, name, crcs[name], error)) return false;
  }
  if (r != ARCHIVE_EOF) {
    *error = archive_error_string(a.get()) ? archive_error_string(a.get()) : "the archive ended early";
    return false;
  }
  for (const auto& [name, crc] : crcs) {
    if (!fs::exists(dir / name)) {
      *error = name + " is missing from the archive";
      return false;
    }
  }
  return true;
}

// One attempt: the stream from `state`, unpacked into `dir`. The stream's status, or
// INTERNAL/DATA_LOSS from the unpacking when the stream itself ended well.
grpc::Status DownloadAttempt(Client& client, const std::string& name, const fs::path& dir, DownloadState& state,
                             const fs::path& state_file, v1::CheckpointArchive* archive) {
  v1::DownloadCheckpointRequest req;
  req.set_name(name);
  req.set_offset(state.offset);
  req.set_etag(state.offset > 0 ? state.etag : "");
  std::unique_ptr<grpc::ClientContext> ctx = client.Context(/*unary=*/false);
  std::unique_ptr<grpc::ClientReader<v1::DownloadCheckpointResponse>> reader =
      client.jobs().DownloadCheckpoint(ctx.get(), req);
  ArchiveStream stream;
  stream.reader = reader.get();
  stream.offset = state.offset;
  std::string error;
  bool unpacked = false;
  const bool got = reader->Read(&stream.message);
  if (got && stream.message.has_archive()) {
    stream.archive = stream.message.archive();
    *archive = stream.archive;
    state.etag = stream.archive.etag();
    unpacked = UnpackStream(stream, dir, state, state_file, &error);
  }
  // A stream that sent something is stopped: one not unpacked, and one whose archive ended with
  // every file in place (a server that holds it open after the end is not waited for). One that
  // sent nothing has ended with the server's status (NOT_FOUND for a missing or another project's
  // job), which Finish gives.
  if (got) ctx->TryCancel();
  const grpc::Status s = reader->Finish();
  if (!s.ok() && s.error_code() != grpc::StatusCode::CANCELLED) return s;
  if (!unpacked) return grpc::Status(grpc::StatusCode::DATA_LOSS, error.empty() ? "an empty stream" : error);
  return grpc::Status::OK;
}

void AddDownload(CLI::App& app, const Cli& cli) {
  struct Args {
    std::string job, step, dir;
  };
  auto a = std::make_shared<Args>();
  auto* dl = app.add_subcommand("download", "Download a job's checkpoint (the final one, or STEP's) into DIR")
                 ->footer(
                     "Examples:\n  oomb download job-abc123 --dir ./adapter\n"
                     "  oomb download job-abc123 40 --dir ./step-40\n"
                     "A cut-off download resumes when run again with the same DIR.");
  dl->add_option("job", a->job, "Job id or name")->required();
  dl->add_option("step", a->step, "A checkpoint's step (default: the final checkpoint)");
  dl->add_option("-d,--dir", a->dir, "Where the files go (default: ./<job id>-<checkpoint>)");
  OnRun(dl, [cli, a] {
    const std::string job = JobName(cli.globals, a->job);
    const std::string name = job + "/checkpoints/" + (a->step.empty() ? "final" : a->step);
    const std::string id = job.substr(job.rfind('/') + 1);
    const fs::path dir = a->dir.empty() ? fs::path(id + "-" + (a->step.empty() ? "final" : a->step)) : fs::path(a->dir);
    std::error_code ec;
    const bool made = !fs::exists(dir);
    fs::create_directories(dir, ec);
    const fs::path state_file = dir / ".oomb-download";
    DownloadState state = DownloadState::Load(state_file);
    v1::CheckpointArchive archive;
    grpc::Status s;
    for (int attempt = 0;; ++attempt) {
      s = DownloadAttempt(cli.client(), name, dir, state, state_file, &archive);
      if (s.error_code() == grpc::StatusCode::ABORTED && state.offset > 0) {  // the checkpoint changed: start over
        state = {};
        continue;
      }
      const bool transient = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                             s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                             s.error_code() == grpc::StatusCode::INTERNAL;
      if (s.ok() || !transient || attempt >= 5) break;
      if (Tty()) std::cerr << "\n";
      std::cerr << fmt::format("oomb: the download stopped ({}); resuming\n", s.error_message());
      std::this_thread::sleep_for(std::chrono::milliseconds(250 << attempt));
    }
    if (Tty()) std::cerr << "\n";
    if (!s.ok()) {
      // Nothing came: the directory this command made goes again (a partial download stays, to resume).
      if (made && state.offset == 0) {
        fs::remove(state_file, ec);
        fs::remove(dir, ec);  // only if empty
      }
      return Fail(s);
    }
    fs::remove(state_file);
    if (!PrintStructured(cli.globals, archive)) std::cout << fs::absolute(dir).lexically_normal().string() << "\n";
    return 0;
  });
}

}  // namespace

void AddTransferCommands(CLI::App& app, const Cli& cli) {
  CLI::App* datasets = app.add_subcommand("datasets", "Uploaded datasets: upload, list, get, delete");
  datasets->require_subcommand(1);
  AddUpload(*datasets, cli);
  AddDatasetQueries(*datasets, cli);
  AddDownload(app, cli);
}

}  // namespace oomb::client
