// Data in, models out: `oomb datasets upload|list|get|delete` and `oomb download`.
//
// upload: the file's SHA-256 and size are computed first and sent with it, so the server refuses
// what arrives damaged; the id defaults to "ds-" and the first 12 hex digits of the SHA-256, so
// an upload retried after a lost answer finds the same dataset instead of making a second one.
//
// download: the checkpoint's tar stream (DownloadCheckpoint) is appended to DIR/.oomb-download.tar
// (its etag beside it in .oomb-download.etag); a stream cut off (the server restarting, the
// network) is resumed from the bytes already there, by this run (a few attempts, with backoff)
// or by running the command again. When complete, the archive is unpacked into DIR (its files
// flat, as the checkpoint directory holds them), each file's CRC-32 checked against the
// checkpoint's manifest, and the partial files removed.
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <archive.h>
#include <archive_entry.h>

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

bool Tty() { return ::isatty(STDERR_FILENO) != 0; }

// The SHA-256 (hex) and size of a file; an error message when it cannot be read.
bool HashFile(const std::string& path, std::string* sha, int64_t* size, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = path + ": cannot be read";
    return false;
  }
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::string buf(kChunk, '\0');
  *size = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = in.gcount();
    if (n <= 0) break;
    EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(n));
    *size += n;
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &len);
  *sha = absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(digest), len));
  return true;
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
    std::string sha, error;
    int64_t size = 0;
    if (!HashFile(a->file, &sha, &size, &error)) {
      std::cerr << "oomb: error: " << error << "\n";
      return int{kError};
    }
    v1::UploadDatasetRequest first;
    first.set_parent(Parent(cli.globals));
    first.set_dataset_id(a->id.empty() ? "ds-" + sha.substr(0, 12) : a->id);
    first.set_display_name(a->display_name.empty() ? fs::path(a->file).filename().string() : a->display_name);
    first.set_sha256(sha);
    first.set_size_bytes(size);
    std::ifstream in(a->file, std::ios::binary);
    v1::Dataset dataset;
    std::unique_ptr<grpc::ClientContext> ctx = cli.client().Context(/*unary=*/false);
    std::unique_ptr<grpc::ClientWriter<v1::UploadDatasetRequest>> writer =
        cli.client().datasets().UploadDataset(ctx.get(), &dataset);
    v1::UploadDatasetRequest m = first;
    std::string buf(kChunk, '\0');
    int64_t sent = 0;
    bool open = true;
    while (open && in) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      const std::streamsize n = in.gcount();
      if (n <= 0) break;
      m.set_data(buf.data(), static_cast<size_t>(n));
      open = writer->Write(m);
      m.Clear();
      sent += n;
      if (Tty()) std::cerr << fmt::format("\ruploading {}: {} of {}", a->file, Bytes(sent), Bytes(size)) << std::flush;
    }
    if (size == 0) writer->Write(first);  // an empty file: the server says what is wrong with it
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

// Reads the stream into `tar` from its current size; returns the archive's description (from the
// first message) and the final status.
grpc::Status ReceiveArchive(Client& client, v1::DownloadCheckpointRequest req, const fs::path& tar,
                            v1::CheckpointArchive* archive) {
  std::unique_ptr<grpc::ClientContext> ctx = client.Context(/*unary=*/false);
  std::unique_ptr<grpc::ClientReader<v1::DownloadCheckpointResponse>> reader =
      client.jobs().DownloadCheckpoint(ctx.get(), req);
  std::FILE* out = std::fopen(tar.c_str(), "ab");
  if (out == nullptr) return grpc::Status(grpc::StatusCode::INTERNAL, tar.string() + ": cannot be written");
  v1::DownloadCheckpointResponse m;
  int64_t have = req.offset();
  while (reader->Read(&m)) {
    if (m.has_archive()) {
      *archive = m.archive();
      continue;
    }
    if (std::fwrite(m.data().data(), 1, m.data().size(), out) != m.data().size()) {
      std::fclose(out);
      ctx->TryCancel();
      return grpc::Status(grpc::StatusCode::INTERNAL, tar.string() + ": write failed (disk full?)");
    }
    have += static_cast<int64_t>(m.data().size());
    if (Tty() && archive->total_bytes() > 0) {
      std::cerr << fmt::format("\rdownloading {}: {} of {}", archive->name(), Bytes(have),
                               Bytes(archive->total_bytes()))
                << std::flush;
    }
  }
  std::fflush(out);
  ::fsync(::fileno(out));
  std::fclose(out);
  return reader->Finish();
}

// Unpacks `tar` into `dir`, its entries' top directory stripped, each file's CRC-32 checked.
bool Unpack(const fs::path& tar, const fs::path& dir, const v1::CheckpointArchive& archive, std::string* error) {
  std::map<std::string, uint32_t> crcs;
  for (const auto& f : archive.files()) crcs[f.path()] = f.crc32();
  std::unique_ptr<struct archive, decltype(&archive_read_free)> a(archive_read_new(), archive_read_free);
  archive_read_support_format_tar(a.get());
  if (archive_read_open_filename(a.get(), tar.c_str(), 1 << 20) != ARCHIVE_OK) {
    *error = archive_error_string(a.get());
    return false;
  }
  struct archive_entry* e = nullptr;
  const std::string prefix = archive.root() + "/";
  std::string buf(kChunk, '\0');
  while (archive_read_next_header(a.get(), &e) == ARCHIVE_OK) {
    const std::string path = archive_entry_pathname(e);
    if (path == prefix) continue;
    const std::string name = path.rfind(prefix, 0) == 0 ? path.substr(prefix.size()) : "";
    if (name.empty() || name.find('/') != std::string::npos || name == ".." || !crcs.count(name) ||
        archive_entry_filetype(e) != AE_IFREG) {
      *error = "unexpected entry in the archive: " + path;
      return false;
    }
    const fs::path tmp = dir / ("." + name + ".part");
    std::FILE* out = std::fopen(tmp.c_str(), "wb");
    if (out == nullptr) {
      *error = tmp.string() + ": cannot be written";
      return false;
    }
    uLong crc = crc32(0L, Z_NULL, 0);
    for (la_ssize_t n; (n = archive_read_data(a.get(), buf.data(), buf.size())) > 0;) {
      crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(n));
      std::fwrite(buf.data(), 1, static_cast<size_t>(n), out);
    }
    std::fclose(out);
    if (crcs[name] != 0 && static_cast<uint32_t>(crc) != crcs[name]) {
      fs::remove(tmp);
      *error = fmt::format("{}: CRC-32 {:08x}, the checkpoint's manifest says {:08x}", name, static_cast<uint32_t>(crc),
                           crcs[name]);
      return false;
    }
    fs::rename(tmp, dir / name);
  }
  return true;
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
    v1::DownloadCheckpointRequest req;
    req.set_name(job + "/checkpoints/" + (a->step.empty() ? "final" : a->step));
    const std::string id = job.substr(job.rfind('/') + 1);
    const fs::path dir = a->dir.empty() ? fs::path(id + "-" + (a->step.empty() ? "final" : a->step)) : fs::path(a->dir);
    std::error_code ec;
    fs::create_directories(dir, ec);
    const fs::path tar = dir / ".oomb-download.tar", etag_file = dir / ".oomb-download.etag";
    v1::CheckpointArchive archive;
    grpc::Status s;
    for (int attempt = 0;; ++attempt) {
      req.set_offset(fs::exists(tar) ? static_cast<int64_t>(fs::file_size(tar)) : 0);
      req.set_etag(req.offset() > 0 && fs::exists(etag_file) ? Trim(ReadAll(etag_file.string())) : "");
      s = ReceiveArchive(cli.client(), req, tar, &archive);
      if (!archive.etag().empty()) std::ofstream(etag_file) << archive.etag() << "\n";
      if (s.error_code() == grpc::StatusCode::ABORTED && req.offset() > 0) {  // the checkpoint changed: start over
        fs::remove(tar);
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
    if (!s.ok()) return Fail(s);
    const int64_t have = fs::exists(tar) ? static_cast<int64_t>(fs::file_size(tar)) : 0;
    if (have != archive.total_bytes()) {
      std::cerr << fmt::format("oomb: error: the archive has {} of its {} bytes; run the command again\n", have,
                               archive.total_bytes());
      return int{kError};
    }
    std::string error;
    if (!Unpack(tar, dir, archive, &error)) {
      std::cerr << "oomb: error: " << error << " (" << tar.string() << " is kept)\n";
      return int{kError};
    }
    fs::remove(tar);
    fs::remove(etag_file);
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
