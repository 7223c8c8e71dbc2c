#include "fs/content/read_ahead.hpp"

#include <algorithm>

namespace ckpt::fs {

read_ahead::read_ahead(std::vector<std::size_t> predicted, std::vector<std::size_t> file_order,
                       std::vector<std::uint64_t> length, std::uint64_t ahead_bytes,
                       bool tail_early, std::uint64_t stray_bytes, std::vector<bool> stored_tensors)
    : predicted_(std::move(predicted)),
      file_(std::move(file_order)),
      length_(std::move(length)),
      ahead_bytes_(ahead_bytes),
      tail_early_(tail_early),
      stray_bytes_(stray_bytes),
      stored_(std::move(stored_tensors)) {
  std::size_t n = length_.size();
  for (auto t : predicted_) n = std::max(n, t + 1);
  for (auto t : file_) n = std::max(n, t + 1);
  pos_predicted_.assign(n, none);
  pos_file_.assign(n, none);
  for (std::size_t i = 0; i < predicted_.size(); ++i) pos_predicted_[predicted_[i]] = i;
  for (std::size_t i = 0; i < file_.size(); ++i) pos_file_[file_[i]] = i;
  queued_.assign(n, false);
  auto prefix = [&](const std::vector<std::size_t>& order) {
    std::vector<std::uint64_t> sum(order.size() + 1, 0);
    for (std::size_t i = 0; i < order.size(); ++i)
      sum[i + 1] = sum[i] + (order[i] < length_.size() ? length_[order[i]] : 0);
    return sum;
  };
  bytes_predicted_ = prefix(predicted_);
  bytes_file_ = prefix(file_);
  for (auto it = file_.rbegin(); it != file_.rend() && tail_ == none; ++it)
    if (!stored(*it)) tail_ = *it;
}

std::size_t read_ahead::successor(const std::vector<std::size_t>& order,
                                  const std::vector<std::size_t>& pos, std::size_t t) const {
  if (t >= pos.size() || pos[t] == none) return none;
  for (std::size_t i = pos[t] + 1; i < order.size(); ++i)
    if (!stored(order[i])) return order[i];
  return none;
}

std::vector<std::size_t> read_ahead::queue_after(const std::vector<std::size_t>& order,
                                                 std::size_t from, std::size_t* last,
                                                 std::uint64_t budget) {
  std::vector<std::size_t> out;
  std::uint64_t ahead = 0;
  bool one = false;  // a decoded tensor looked at
  std::size_t i = from;
  for (; i < order.size() && (ahead < budget || !one); ++i) {
    const std::size_t t = order[i];
    if (stored(t)) continue;
    one = true;
    ahead += t < length_.size() ? length_[t] : 0;
    if (queued_[t]) continue;
    queued_[t] = true;
    out.push_back(t);
  }
  if (last) *last = i == 0 ? 0 : i - 1;
  return out;
}

std::vector<std::size_t> read_ahead::follow_predicted(std::size_t t, bool jump) {
  file_mode_ = false;
  place_ = t;
  // After a jump only the next tensor: a stray read that looked like one (the reader then comes
  // back) costs one tensor's decode, not a whole budget that pushes out what the reader needs.
  return queue_after(predicted_, pos_predicted_[t] + 1, &horizon_, jump ? 0 : ahead_bytes_);
}

std::vector<std::size_t> read_ahead::start() {
  std::lock_guard lock(mu_);
  if (started_) return {};
  started_ = true;
  if (predicted_.empty()) return {};
  std::vector<std::size_t> out = queue_after(predicted_, 0);
  if (tail_early_ && tail_ != none && !queued_[tail_]) {
    queued_[tail_] = true;
    // out[0] is the first in predicted order: queued just now.
    out.insert(out.begin() + std::ptrdiff_t(std::min<std::size_t>(1, out.size())), tail_);
  }
  return out;
}

std::vector<std::size_t> read_ahead::touch(std::size_t t) {
  if (last_.load(std::memory_order_relaxed) == t) return {};
  std::lock_guard lock(mu_);
  if (t >= pos_predicted_.size() || pos_predicted_[t] == none) return {};
  if (tail_early_ && t == tail_) {
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
  // Read now: a later pass over the file may queue it again. Unless the read was the kernel's
  // ahead of the reader (below): the reader has not been there yet, and t is still queued for
  // it (expects()).
  const bool was_queued = queued_[t];
  queued_[t] = false;
  auto ahead_of_reader = [&] {
    queued_[t] = was_queued;
    return std::vector<std::size_t>{};
  };
  const bool file_step = prev != none && t == successor(file_, pos_file_, prev);
  if (file_mode_) {
    if (prev != none && !file_step && t == successor(predicted_, pos_predicted_, prev))
      return follow_predicted(t);
    return queue_after(file_, pos_file_[t] + 1);
  }
  if (place_ == none) return follow_predicted(t);
  const std::size_t pt = pos_predicted_[t], pp = pos_predicted_[place_];
  // The next in predicted order (stored tensors between may never be seen: page cache), even
  // if the kernel's read-ahead got there first: the reader goes there next anyway.
  if (t == successor(predicted_, pos_predicted_, place_)) return follow_predicted(t);
  if (pt == pp) return {};  // back at its place after a stray read
  if (pt < pp && bytes_predicted_[pp] - bytes_predicted_[pt] <= stray_bytes_) return {};
  const std::size_t ft = pos_file_[t], fp = pos_file_[place_];
  // Bytes of the tensors between the reader's place and t along file order. The kernel's
  // read-ahead past the place is checked before the rest of the predicted window: where both
  // orders agree (torch's keys 40, 41, 42 ...) letting it move the place further than the next
  // tensor moved it ever further ahead of the reader, and the decodes it queued went out of the
  // chunk cache before the reader came.
  const bool past = ft != none && fp != none && ft > fp;
  const std::uint64_t gap = past ? bytes_file_[ft] - bytes_file_[fp + 1] : 0;
  if (past && gap < stray_bytes_) return ahead_of_reader();
  if (pt > pp && pt <= horizon_) return follow_predicted(t);  // moved on within what is queued
  if (past && file_step) {
    file_mode_ = true;
    return queue_after(file_, ft + 1);
  }
  return follow_predicted(t, true);
}

bool read_ahead::expects(std::size_t t) const {
  std::lock_guard lock(mu_);
  return file_mode_ || place_ == none || place_ == t || (t < queued_.size() && queued_[t]);
}

bool read_ahead::following_file_order() const {
  std::lock_guard lock(mu_);
  return file_mode_;
}

}  // namespace ckpt::fs
