// A checkpoint as a tar archive (DownloadCheckpoint, proto/oomb/v1/jobs.proto): the same bytes at
// every download of the same checkpoint, so that a download cut off resumes from any offset.
//
// The archive (libarchive's POSIX pax writer, restricted: plain ustar headers unless a name or
// size needs more): a directory entry `<root>/`, then every regular file of the checkpoint
// directory in name order as `<root>/<name>`, mode 0644, owner 0:0 without names, mtime that of
// the checkpoint's manifest (oomb_checkpoint.json, worker/train/checkpoint.h). A checkpoint is
// written once and never changed; its etag digests the manifest, the names and the sizes, so a
// checkpoint rewritten under the same name (a pause at an already saved step) has another etag
// only if its content could differ.
//
// A file with more than one hard link is refused (FAILED_PRECONDITION naming it), at Open and
// again when Stream reads it: the daemon writes each checkpoint file with one link, so another
// one was made by someone with access to the directory, and may be a file outside the roots
// linked in under a checkpoint's name (issue 78; docs/RELIABILITY.md, "Trust boundary: hard
// links").
//
// Resuming: Stream(offset) produces the archive again and sends only its bytes from `offset`;
// the files whose bytes all lie before `offset` are not read (zeros stand in for them).
//
// Thread-safety: an Archive is immutable; Stream may run on any thread.
#ifndef OOMB_SERVER_CHECKPOINT_ARCHIVE_H_
#define OOMB_SERVER_CHECKPOINT_ARCHIVE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "oomb/v1/jobs.pb.h"
#include "worker/common/file_access.h"

namespace oomb::server {

class CheckpointArchiveWriter {
 public:
  // Lists `dir` (a checkpoint directory: regular files only; anything else is refused), reads
  // its manifest's CRC-32s and measures the archive. `root`: the archive's top directory
  // ("checkpoint-<step>", "final"). NOT_FOUND without a manifest (not a complete checkpoint).
  static absl::StatusOr<CheckpointArchiveWriter> Open(Dir dir, std::string root);

  // The archive's description (CheckpointArchive without name and offset).
  const v1::CheckpointArchive& description() const { return description_; }

  // Sends the archive's bytes from `offset` (0 <= offset <= total_bytes) to `sink`, in pieces of
  // at most `chunk` bytes; `sink` returns false to stop (CANCELLED). OUT_OF_RANGE for an offset
  // past the end; DATA_LOSS when a file changed size since Open.
  absl::Status Stream(int64_t offset, size_t chunk, const std::function<bool(absl::string_view)>& sink) const;

 private:
  CheckpointArchiveWriter(Dir dir, v1::CheckpointArchive description, int64_t mtime)
      : dir_(std::move(dir)), description_(std::move(description)), mtime_(mtime) {}
  // Writes the archive through libarchive to `out`; files whose bytes end at or before
  // `skip_before` are written as zeros, unread.
  absl::Status Write(int64_t skip_before, const std::function<bool(const void*, size_t)>& out) const;

  Dir dir_;
  v1::CheckpointArchive description_;
  int64_t mtime_ = 0;
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_CHECKPOINT_ARCHIVE_H_
