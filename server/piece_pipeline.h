// Work over a stream of byte pieces (an upload's messages) in stages that run side by side, so
// that the thread receiving the pieces only hands them on: each stage (hashing, writing,
// checking) takes every piece in order on a thread of its own, at the WorkPool's lower CPU
// priority. At most `max_pending_bytes` wait for the slowest stage: beyond, Push says to wait
// and `on_room` is called once the stages have made room (half of it), which is how the caller
// holds its client back. The first stage error ends the work of every stage.
//
// Thread-safety: Push, status and Finish/Abort from one thread at a time (the stream's);
// on_room is called from a stage's thread.
#ifndef OOMB_SERVER_PIECE_PIPELINE_H_
#define OOMB_SERVER_PIECE_PIPELINE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace oomb::server {

class PiecePipeline {
 public:
  // A stage may keep the piece (its bytes never change) beyond the call.
  using Piece = std::shared_ptr<const std::string>;
  using Stage = std::function<absl::Status(const Piece& piece)>;

  PiecePipeline(std::vector<Stage> stages, size_t max_pending_bytes, std::function<void()> on_room);
  ~PiecePipeline();  // Abort()
  PiecePipeline(const PiecePipeline&) = delete;
  PiecePipeline& operator=(const PiecePipeline&) = delete;

  // Queues `piece` for every stage. False when the pending bytes now pass the limit: push no
  // more until on_room is called (it is, also when a stage fails meanwhile).
  bool Push(std::string piece);
  // The first stage error so far; OK while none.
  absl::Status status();
  // Waits until every stage has taken every piece (or one failed), stops the threads; the
  // first error.
  absl::Status Finish();
  // Stops the threads after the pieces they are at.
  void Abort();

 private:
  void Run(size_t stage);
  void Stop(bool wait_for_pieces);
  bool Idle(size_t stage) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<Stage> stages_;
  const size_t max_pending_bytes_;
  const std::function<void()> on_room_;
  absl::Mutex mu_;
  std::deque<Piece> pieces_ ABSL_GUARDED_BY(mu_);  // from index first_
  int64_t first_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> next_ ABSL_GUARDED_BY(mu_);  // each stage's next piece
  size_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool held_ ABSL_GUARDED_BY(mu_) = false;     // Push said to wait
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // no more pieces: stages end when done
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace oomb::server

#endif  // OOMB_SERVER_PIECE_PIPELINE_H_
