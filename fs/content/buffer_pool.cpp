#include "fs/content/buffer_pool.hpp"

namespace ckpt::fs {

buffer_pool::buffer_pool(std::size_t buffer_bytes, std::size_t max_free)
    : buffer_bytes_(buffer_bytes), max_free_(max_free) {
  free_.reserve(max_free_);
}

store::page_buffer buffer_pool::take(std::size_t n) {
  if (n > buffer_bytes_ || 2 * n < buffer_bytes_) return store::page_buffer(n);
  store::page_buffer b;
  {
    std::lock_guard lock(mu_);
    if (!free_.empty()) {
      b = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (!b.data()) b = store::page_buffer(buffer_bytes_);
  b.resize_within(n);
  return b;
}

void buffer_pool::give(store::page_buffer&& b) noexcept {
  if (b.capacity() != buffer_bytes_) return;  // not pool-sized: the caller's object frees it
  std::lock_guard lock(mu_);
  if (free_.size() < max_free_) free_.push_back(std::move(b));
}

std::size_t buffer_pool::free_count() const {
  std::lock_guard lock(mu_);
  return free_.size();
}

}  // namespace ckpt::fs
