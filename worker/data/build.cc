#include "worker/data/build.h"

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "worker/common/file_access.h"
#include "worker/common/status.h"

namespace oomb {
namespace {

namespace fs = std::filesystem;

// Cut levels, coarse to fine. A piece made at level l is split further at level l + 1.
constexpr std::string_view kSeparators[] = {"\n\n", "\n", ". ", " "};
constexpr int kCharLevel = 4;  // between UTF-8 characters, by halving

struct Piece {
  size_t begin = 0, end = 0;
  int level = 0;
  int64_t tokens = -1;  // -1: not counted yet
};

class Cutter {
 public:
  Cutter(const std::string& text, const Tokenizer& tok, const BuildOptions& o) : text_(text), tok_(tok), o_(o) {}

  absl::StatusOr<int64_t> Count(size_t begin, size_t end) const {
    auto ids = tok_.EncodeChecked(std::string_view(text_).substr(begin, end - begin));
    if (!ids.ok()) {
      return absl::Status(ids.status().code(), absl::StrCat("at byte ", begin, ": ", ids.status().message()));
    }
    return static_cast<int64_t>(ids->size());
  }

  absl::Status Count(Piece& p) const {
    if (p.tokens >= 0) return absl::OkStatus();
    OOMB_ASSIGN_OR_RETURN(p.tokens, Count(p.begin, p.end));
    return absl::OkStatus();
  }

  // The pieces of `p` at the first finer level that cuts it; empty when it is one character.
  std::vector<Piece> Split(const Piece& p) const {
    for (int level = p.level + 1; level <= kCharLevel; ++level) {
      std::vector<Piece> out;
      if (level < kCharLevel) {
        const std::string_view sep = kSeparators[level];
        const std::string_view piece = std::string_view(text_).substr(p.begin, p.end - p.begin);
        size_t b = 0;
        for (size_t at = piece.find(sep); at != std::string_view::npos; at = piece.find(sep, b)) {
          b = at + sep.size();
          if (b >= piece.size()) break;
          out.push_back({out.empty() ? p.begin : out.back().end, p.begin + b, level});
        }
        if (!out.empty()) out.push_back({out.back().end, p.end, level});
      } else {
        size_t mid = p.begin + (p.end - p.begin) / 2;
        auto continuation = [&](size_t i) { return (static_cast<unsigned char>(text_[i]) & 0xC0) == 0x80; };
        while (mid > p.begin && continuation(mid)) --mid;
        if (mid == p.begin) {
          mid = p.begin + 1;
          while (mid < p.end && continuation(mid)) ++mid;
        }
        if (mid < p.end) out = {{p.begin, mid, level}, {mid, p.end, level}};
      }
      if (out.size() >= 2) return out;
    }
    return {};
  }

  // Cuts the whole text into samples, calling `emit(text, tokens)` for each until it says stop.
  absl::Status Run(const std::function<bool(const std::string&, int64_t)>& emit) {
    emit_ = &emit;
    if (!text_.empty()) queue_.push_back({0, text_.size(), -1});
    while (true) {
      if (queue_.empty()) {
        if (cur_.size() == overlap_) break;
        // The end of the text. Pieces Flush() gives back return to the queue and are placed.
        OOMB_ASSIGN_OR_RETURN(const bool go_on, Flush());
        if (!go_on) break;
        continue;
      }
      Piece& p = queue_.front();
      OOMB_RETURN_IF_ERROR(Count(p));
      if (p.tokens > o_.target_tokens) {
        if (!RefineFront()) {
          return absl::InvalidArgumentError(absl::StrCat("at byte ", p.begin, ": one character is ", p.tokens,
                                                         " tokens, more than the target (", o_.target_tokens, ")"));
        }
        continue;
      }
      if (est_ + correction_ + p.tokens <= o_.target_tokens) {
        est_ += p.tokens;
        cur_.push_back(p);
        queue_.pop_front();
        continue;
      }
      // The piece does not fit: cut it to fill the sample if the sample is not full enough.
      if (static_cast<double>(est_ + correction_) < MinTokens() && RefineFront()) continue;
      if (cur_.size() == overlap_) {  // nothing new fits beside the overlap: drop the overlap
        DropOverlap();
        continue;
      }
      OOMB_ASSIGN_OR_RETURN(const bool go_on, Flush());
      if (!go_on) break;
    }
    return absl::OkStatus();
  }

 private:
  double MinTokens() const { return o_.min_fill * static_cast<double>(o_.target_tokens); }

  void Reset() {
    est_ = 0;
    correction_ = 0;
    retries_ = 0;
    for (const Piece& p : cur_) est_ += p.tokens;
  }

  void DropOverlap() {
    cur_.clear();
    overlap_ = 0;
    Reset();
  }

  bool RefineFront() {
    std::vector<Piece> finer = Split(queue_.front());
    if (finer.empty()) return false;
    queue_.pop_front();
    queue_.insert(queue_.begin(), finer.begin(), finer.end());
    return true;
  }

  // The last pieces of `sample` (cut finer where needed), together at most overlap_tokens.
  absl::StatusOr<std::vector<Piece>> OverlapTail(const std::vector<Piece>& sample) const {
    std::vector<Piece> tail, stack(sample.begin(), sample.end());
    int64_t tokens = 0;
    while (!stack.empty() && o_.overlap_tokens > 0) {
      Piece p = stack.back();
      stack.pop_back();
      OOMB_RETURN_IF_ERROR(Count(p));
      if (tokens + p.tokens <= o_.overlap_tokens) {
        tail.insert(tail.begin(), p);
        tokens += p.tokens;
        continue;
      }
      std::vector<Piece> finer = Split(p);
      if (finer.empty()) break;  // the tail must be contiguous: stop at the first piece that does not fit
      stack.insert(stack.end(), finer.begin(), finer.end());
    }
    if (!tail.empty() && tail.front().begin == sample.front().begin) tail.erase(tail.begin());  // move on
    return tail;
  }

  // Measures the sample's joined count. Over the target: gives its last piece back. Under
  // min_fill with more text to come and a new measurement: lets Run fill on with the corrected
  // estimate. Else emits it and starts the next sample with the overlap. Returns false when
  // emit said stop.
  absl::StatusOr<bool> Flush() {
    OOMB_ASSIGN_OR_RETURN(const int64_t exact, Count(cur_.front().begin, cur_.back().end));
    const bool changed = exact - est_ != correction_;
    correction_ = exact - est_;
    ++retries_;
    if (exact > o_.target_tokens) {
      est_ -= cur_.back().tokens;
      queue_.push_front(cur_.back());
      cur_.pop_back();
      if (cur_.size() == overlap_) DropOverlap();  // not even one new piece fits beside the overlap
      return true;
    }
    if (static_cast<double>(exact) < MinTokens() && !queue_.empty() && changed && retries_ < 32) return true;
    if (!(*emit_)(text_.substr(cur_.front().begin, cur_.back().end - cur_.front().begin), exact)) return false;
    OOMB_ASSIGN_OR_RETURN(cur_, OverlapTail(cur_));
    overlap_ = cur_.size();
    Reset();
    return true;
  }

  const std::string& text_;
  const Tokenizer& tok_;
  const BuildOptions& o_;
  const std::function<bool(const std::string&, int64_t)>* emit_ = nullptr;
  std::deque<Piece> queue_;  // the text not yet placed, front first
  std::vector<Piece> cur_;   // the sample being filled: `overlap_` pieces repeated, then new ones
  size_t overlap_ = 0;
  int64_t est_ = 0;  // sum of cur_'s piece counts
  // The joined text's count minus `est_`, as last measured (BPE merges across piece boundaries
  // make it differ by a few tokens either way): est_ + correction_ estimates the sample's
  // count. `retries_` bounds the re-measuring of one sample.
  int64_t correction_ = 0;
  int retries_ = 0;
};

}  // namespace

absl::StatusOr<std::vector<std::string>> ListInputFiles(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(in, ec);
    if (ec || !fs::exists(st)) return absl::NotFoundError(absl::StrCat(in, ": no such file or directory"));
    if (fs::is_regular_file(st)) {
      files.push_back(in);
      continue;
    }
    if (!fs::is_directory(st)) return absl::InvalidArgumentError(absl::StrCat(in, ": not a file or directory"));
    std::vector<std::string> found;
    for (auto it = fs::recursive_directory_iterator(in, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (!name.empty() && name[0] == '.') {
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (it->is_regular_file()) found.push_back(it->path().string());
    }
    if (ec) return absl::InternalError(absl::StrCat(in, ": cannot list: ", ec.message()));
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  if (files.empty()) return absl::InvalidArgumentError("no input files");
  return files;
}

absl::Status CutText(const std::string& text, const Tokenizer& tokenizer, const BuildOptions& options,
                     const std::function<bool(const std::string& sample, int64_t tokens)>& emit) {
  if (options.target_tokens <= 0) return absl::InvalidArgumentError("--tokens must be > 0");
  if (options.overlap_tokens < 0 || options.overlap_tokens >= options.target_tokens) {
    return absl::InvalidArgumentError("--overlap must be in [0, --tokens)");
  }
  if (!(options.min_fill > 0 && options.min_fill <= 1)) return absl::InvalidArgumentError("min_fill must be in (0, 1]");
  Cutter cutter(text, tokenizer, options);
  return cutter.Run(emit);
}

absl::StatusOr<BuildStats> BuildTextDataset(const std::vector<std::string>& inputs, const Tokenizer& tokenizer,
                                            const BuildOptions& options, const std::string& out_path) {
  OOMB_ASSIGN_OR_RETURN(const std::vector<std::string> files, ListInputFiles(inputs));
  const std::string tmp = out_path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  BuildStats st;
  bool done = false;
  for (const std::string& file : files) {
    if (done) break;
    OOMB_ASSIGN_OR_RETURN(const std::string text, FileAccess::Unconfined()->ReadFile(file));
    ++st.files;
    st.bytes += static_cast<int64_t>(text.size());
    const absl::Status s = CutText(text, tokenizer, options, [&](const std::string& sample, int64_t tokens) {
      out << nlohmann::json{{"text", sample}}.dump() << "\n";
      st.min_sample_tokens = st.samples == 0 ? tokens : std::min(st.min_sample_tokens, tokens);
      st.max_sample_tokens = std::max(st.max_sample_tokens, tokens);
      ++st.samples;
      st.tokens += tokens;
      done = options.max_samples > 0 && st.samples >= options.max_samples;
      return !done;
    });
    if (!s.ok()) {
      std::error_code ec;
      fs::remove(tmp, ec);
      return absl::Status(s.code(), absl::StrCat(file, ": ", s.message()));
    }
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("error writing ", tmp));
  std::error_code ec;
  fs::rename(tmp, out_path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", out_path, ": ", ec.message()));
  return st;
}

}  // namespace oomb
