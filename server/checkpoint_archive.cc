#include "server/checkpoint_archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <limits>
#include <memory>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "worker/common/status.h"

namespace oomb::server {
namespace {

constexpr char kManifest[] = "oomb_checkpoint.json";  // worker/train/checkpoint.h
constexpr size_t kReadBytes = size_t{1} << 20;

struct ArchiveDeleter {
  void operator()(archive* a) const { archive_write_free(a); }
};
struct EntryDeleter {
  void operator()(archive_entry* e) const { archive_entry_free(e); }
};

// libarchive's write callback: hands what it writes to the Write caller's `out`.
la_ssize_t WriteCallback(archive*, void* client, const void* buffer, size_t length) {
  const auto& out = *static_cast<const std::function<bool(const void*, size_t)>*>(client);
  return out(buffer, length) ? static_cast<la_ssize_t>(length) : -1;
}

absl::Status ArchiveError(archive* a, const std::string& what) {
  return absl::InternalError(
      absl::StrCat("checkpoint archive: ", what, ": ",
                   archive_error_string(a) != nullptr ? archive_error_string(a) : "unknown error"));
}

// A file of the checkpoint, refused when it has another hard link: the daemon writes a
// checkpoint's files with one link each, so a second one was made by someone else, and may be a
// file outside the roots (or another project's) linked in under a checkpoint's name. Checked on
// the descriptor, at the listing and again at each open that reads it.
absl::StatusOr<File> OpenSingleLink(const Dir& dir, const std::string& name) {
  OOMB_ASSIGN_OR_RETURN(File f, dir.OpenFile(name));
  struct stat st;
  if (::fstat(f.fd(), &st) != 0) return ErrnoStatus(errno, "stat", dir.PathOf(name));
  if (st.st_nlink != 1) {
    return absl::FailedPreconditionError(absl::StrCat(dir.PathOf(name), " has ", st.st_nlink,
                                                      " hard links; a checkpoint's files have one, so it is not "
                                                      "served (remove the other links, or copy the file)"));
  }
  return f;
}

}  // namespace

absl::StatusOr<CheckpointArchiveWriter> CheckpointArchiveWriter::Open(Dir dir, std::string root) {
  OOMB_ASSIGN_OR_RETURN(const std::string manifest_text, dir.ReadFile(kManifest, 16 << 20));
  const nlohmann::json manifest = nlohmann::json::parse(manifest_text, nullptr, /*allow_exceptions=*/false);
  if (!manifest.is_object() || !manifest.contains("files") || !manifest["files"].is_object()) {
    return absl::DataLossError(absl::StrCat(dir.path(), ": its manifest ", kManifest, " is not valid"));
  }
  v1::CheckpointArchive d;
  d.set_root(root);
  OOMB_ASSIGN_OR_RETURN(const std::vector<DirEntry> entries, dir.List());
  std::string digest_input = manifest_text;
  int64_t manifest_mtime = 0;
  for (const DirEntry& e : entries) {
    if (e.type != EntryType::kFile) {
      return absl::FailedPreconditionError(absl::StrCat(dir.PathOf(e.name), " is not a regular file"));
    }
    OOMB_ASSIGN_OR_RETURN(const File f, OpenSingleLink(dir, e.name));
    v1::CheckpointArchive::File* out = d.add_files();
    out->set_path(e.name);
    out->set_size(f.size());
    if (e.name == kManifest) {
      struct stat st;
      if (::fstat(f.fd(), &st) == 0) manifest_mtime = st.st_mtim.tv_sec;
    } else if (manifest["files"].contains(e.name)) {
      out->set_crc32(manifest["files"][e.name].value("crc32", uint32_t{0}));
    }
    absl::StrAppend(&digest_input, "\n", e.name, " ", f.size());
  }
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(digest_input.data()), digest_input.size(), digest);
  d.set_etag(absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), 16)));
  CheckpointArchiveWriter w(std::move(dir), std::move(d), manifest_mtime);
  // The archive's size: written once with every file's bytes as zeros, unread.
  int64_t total = 0;
  OOMB_RETURN_IF_ERROR(w.Write(std::numeric_limits<int64_t>::max(), [&](const void*, size_t n) {
    total += static_cast<int64_t>(n);
    return true;
  }));
  w.description_.set_total_bytes(total);
  return w;
}

absl::Status CheckpointArchiveWriter::Write(int64_t skip_before,
                                            const std::function<bool(const void*, size_t)>& out) const {
  int64_t position = 0;  // bytes written so far: libarchive writes unblocked, so this is exact
  const std::function<bool(const void*, size_t)> counted = [&](const void* p, size_t n) {
    position += static_cast<int64_t>(n);
    return out(p, n);
  };
  std::unique_ptr<archive, ArchiveDeleter> a(archive_write_new());
  if (archive_write_set_format_pax_restricted(a.get()) != ARCHIVE_OK ||
      archive_write_add_filter_none(a.get()) != ARCHIVE_OK ||
      archive_write_set_bytes_per_block(a.get(), 0) != ARCHIVE_OK ||
      archive_write_open(a.get(), const_cast<std::function<bool(const void*, size_t)>*>(&counted), nullptr,
                         WriteCallback, nullptr) != ARCHIVE_OK) {
    return ArchiveError(a.get(), "opening the writer");
  }
  std::unique_ptr<archive_entry, EntryDeleter> entry(archive_entry_new());
  const auto header = [&](const std::string& path, int64_t size, bool directory) -> absl::Status {
    archive_entry_clear(entry.get());
    archive_entry_set_pathname(entry.get(), path.c_str());
    archive_entry_set_size(entry.get(), size);
    archive_entry_set_filetype(entry.get(), directory ? AE_IFDIR : AE_IFREG);
    archive_entry_set_perm(entry.get(), directory ? 0755 : 0644);
    archive_entry_set_mtime(entry.get(), mtime_, 0);
    archive_entry_set_uid(entry.get(), 0);
    archive_entry_set_gid(entry.get(), 0);
    if (archive_write_header(a.get(), entry.get()) != ARCHIVE_OK) return ArchiveError(a.get(), path);
    return absl::OkStatus();
  };
  OOMB_RETURN_IF_ERROR(header(description_.root() + "/", 0, true));
  std::string buffer(kReadBytes, '\0');
  const std::string zeros(kReadBytes, '\0');
  for (const v1::CheckpointArchive::File& f : description_.files()) {
    const std::string path = absl::StrCat(description_.root(), "/", f.path());
    OOMB_RETURN_IF_ERROR(header(path, f.size(), false));
    const bool read = position + f.size() > skip_before;  // some of its bytes are wanted
    std::optional<File> file;
    if (read) {
      OOMB_ASSIGN_OR_RETURN(file, OpenSingleLink(dir_, f.path()));
    }
    for (int64_t done = 0; done < f.size();) {
      const size_t n = static_cast<size_t>(std::min<int64_t>(kReadBytes, f.size() - done));
      const char* data = zeros.data();
      if (read && position + static_cast<int64_t>(n) > skip_before) {
        const ssize_t got = ::pread(file->fd(), buffer.data(), n, done);
        if (got != static_cast<ssize_t>(n)) {
          return absl::DataLossError(absl::StrCat(dir_.PathOf(f.path()), " changed while it was archived"));
        }
        data = buffer.data();
      }
      if (archive_write_data(a.get(), data, n) != static_cast<la_ssize_t>(n)) {
        if (archive_errno(a.get()) == 0) return absl::CancelledError("the download was stopped");
        return ArchiveError(a.get(), path);
      }
      done += static_cast<int64_t>(n);
    }
  }
  if (archive_write_close(a.get()) != ARCHIVE_OK) return ArchiveError(a.get(), "closing");
  return absl::OkStatus();
}

absl::Status CheckpointArchiveWriter::Stream(int64_t offset, size_t chunk,
                                             const std::function<bool(absl::string_view)>& sink) const {
  if (offset < 0 || offset > description_.total_bytes()) {
    return absl::OutOfRangeError(
        absl::StrCat("offset: ", offset, " is past the archive's ", description_.total_bytes(), " bytes"));
  }
  int64_t position = 0;
  std::string pending;
  bool stopped = false;
  absl::Status written = Write(offset, [&](const void* p, size_t n) {
    const char* bytes = static_cast<const char*>(p);
    int64_t skip = std::clamp<int64_t>(offset - position, 0, static_cast<int64_t>(n));
    position += static_cast<int64_t>(n);
    pending.append(bytes + skip, n - static_cast<size_t>(skip));
    while (pending.size() >= chunk) {
      if (!sink(absl::string_view(pending.data(), chunk))) {
        stopped = true;
        return false;
      }
      pending.erase(0, chunk);
    }
    return true;
  });
  if (stopped) return absl::CancelledError("the download was stopped");
  OOMB_RETURN_IF_ERROR(written);
  if (!pending.empty() && !sink(pending)) return absl::CancelledError("the download was stopped");
  return absl::OkStatus();
}

}  // namespace oomb::server
