#include "fs/content/read_ahead.hpp"

#include <algorithm>

namespace ckpt::fs {

read_ahead::read_ahead(std::vector<std::size_t> predicted, std::vector<std::size_t> file_order,
                       std::vector<std::uint64_t> length, std::uint64_t ahead_bytes,
                       bool tail_early)
    : predicted_(std::move(predicted)),
      file_(std::move(file_order)),
      length_(std::move(length)),
      ahead_bytes_(ahead_bytes),
      tail_early_(tail_early) {
  std::size_t n = length_.size();
  for (auto t : predicted_) n = std::max(n, t + 1);
  for (auto t : file_) n = std::max(n, t + 1);
  pos_predicted_.assign(n, none);
  pos_file_.assign(n, none);
  for (std::size_t i = 0; i < predicted_.size(); ++i) pos_predicted_[predicted_[i]] = i;
  for (std::size_t i = 0; i < file_.size(); ++i) pos_file_[file_[i]] = i;
  queued_.assign(n, false);
}

std::size_t read_ahead::successor(const std::vector<std::size_t>& order,
                                  const std::vector<std::size_t>& pos, std::size_t t) const {
  if (t >= pos.size() || pos[t] == none || pos[t] + 1 >= order.size()) return none;
  return order[pos[t] + 1];
}

std::vector<std::size_t> read_ahead::queue_after(const std::vector<std::size_t>& order,
                                                 std::size_t from) {
  std::vector<std::size_t> out;
  std::uint64_t ahead = 0;
  for (std::size_t i = from; i < order.size() && (ahead < ahead_bytes_ || i == from); ++i) {
    const std::size_t t = order[i];
    ahead += t < length_.size() ? length_[t] : 0;
    if (queued_[t]) continue;
    queued_[t] = true;
    out.push_back(t);
  }
  return out;
}

std::vector<std::size_t> read_ahead::start() {
  std::lock_guard lock(mu_);
  if (started_) return {};
  started_ = true;
  if (predicted_.empty()) return {};
  std::vector<std::size_t> out = queue_after(predicted_, 0);
  if (tail_early_ && !queued_[file_.back()]) {
    queued_[file_.back()] = true;
    out.insert(out.begin() + 1, file_.back());  // out[0] is predicted_[0]: queued just now
  }
  return out;
}

std::vector<std::size_t> read_ahead::touch(std::size_t t) {
  if (last_.load(std::memory_order_relaxed) == t) return {};
  std::lock_guard lock(mu_);
  if (t >= pos_predicted_.size() || pos_predicted_[t] == none) return {};
  if (tail_early_ && t == file_.back()) {
    // The zip tail read (not a step from its predecessor in either order): the reader comes
    // back to where it was, so this neither moves it nor queues what follows the tail.
    const std::size_t prev = last_.load();
    if (prev != t && successor(predicted_, pos_predicted_, prev) != t &&
        successor(file_, pos_file_, prev) != t) {
      queued_[t] = false;
      return {};
    }
  }
  const std::size_t prev = last_.exchange(t);
  if (prev == t) return {};
  started_ = true;
  queued_[t] = false;  // read now: a later pass over the file may queue it again
  if (prev != none) {
    const std::size_t p = successor(predicted_, pos_predicted_, prev);
    const std::size_t f = successor(file_, pos_file_, prev);
    if (t == p && t != f)
      file_mode_ = false;
    else if (t == f && t != p)
      file_mode_ = true;  // a step both orders predict changes nothing
  }
  return file_mode_ ? queue_after(file_, pos_file_[t] + 1)
                    : queue_after(predicted_, pos_predicted_[t] + 1);
}

bool read_ahead::following_file_order() const {
  std::lock_guard lock(mu_);
  return file_mode_;
}

}  // namespace ckpt::fs
