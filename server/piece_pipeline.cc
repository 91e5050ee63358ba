#include "server/piece_pipeline.h"

#include <pthread.h>

#include <algorithm>
#include <string>

#include "server/work_pool.h"

namespace oomb::server {

PiecePipeline::PiecePipeline(std::vector<Stage> stages, size_t max_pending_bytes, std::function<void()> on_room)
    : stages_(std::move(stages)), max_pending_bytes_(max_pending_bytes), on_room_(std::move(on_room)) {
  next_.assign(stages_.size(), 0);
  for (size_t s = 0; s < stages_.size(); ++s) threads_.emplace_back([this, s] { Run(s); });
}

PiecePipeline::~PiecePipeline() { Abort(); }

bool PiecePipeline::Push(std::string piece) {
  absl::MutexLock lock(&mu_);
  pending_bytes_ += piece.size();
  pieces_.push_back(std::make_shared<const std::string>(std::move(piece)));
  held_ = pending_bytes_ > max_pending_bytes_ && status_.ok();
  return !held_;
}

absl::Status PiecePipeline::status() {
  absl::MutexLock lock(&mu_);
  return status_;
}

absl::Status PiecePipeline::Finish() {
  Stop(/*wait_for_pieces=*/true);
  absl::MutexLock lock(&mu_);
  return status_;
}

void PiecePipeline::Abort() { Stop(/*wait_for_pieces=*/false); }

void PiecePipeline::Stop(bool wait_for_pieces) {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    stopping_ = stopping_ || !wait_for_pieces;
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

bool PiecePipeline::Idle(size_t stage) const { return next_[stage] == first_ + static_cast<int64_t>(pieces_.size()); }

void PiecePipeline::Run(size_t stage) {
  LowerThisThreadsPriority();
  ::pthread_setname_np(::pthread_self(), ("oombd-stage-" + std::to_string(stage)).c_str());
  for (;;) {
    Piece piece;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, stage]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !status_.ok() || !Idle(stage) || closing_;
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_ || !status_.ok() || Idle(stage)) return;  // Idle here: closing, nothing left
      piece = pieces_[static_cast<size_t>(next_[stage] - first_)];
    }
    const absl::Status s = stages_[stage](piece);
    bool room = false;
    {
      absl::MutexLock lock(&mu_);
      if (!s.ok() && status_.ok()) status_ = s;
      ++next_[stage];
      const int64_t done = *std::min_element(next_.begin(), next_.end());
      for (; first_ < done; ++first_) {
        pending_bytes_ -= pieces_.front()->size();
        pieces_.pop_front();
      }
      room = held_ && (pending_bytes_ <= max_pending_bytes_ / 2 || !status_.ok());
      held_ = held_ && !room;
    }
    if (room) on_room_();
  }
}

}  // namespace oomb::server
