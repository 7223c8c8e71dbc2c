#pragma once
// The `buffer=` budget: bytes of write buffers held in memory by all open files together. A
// buffer that cannot get more spills to a staging file instead of failing.
#include <atomic>
#include <cstdint>

namespace ckpt::fs {

class memory_budget {
 public:
  explicit memory_budget(std::uint64_t limit) : limit_(limit) {}
  memory_budget(const memory_budget&) = delete;
  memory_budget& operator=(const memory_budget&) = delete;

  // Takes `n` bytes if they fit under the limit; false otherwise (nothing taken).
  bool try_take(std::uint64_t n) {
    std::uint64_t cur = used_.load(std::memory_order_relaxed);
    do {
      if (n > limit_ || cur > limit_ - n) return false;
    } while (!used_.compare_exchange_weak(cur, cur + n, std::memory_order_relaxed));
    return true;
  }
  void give(std::uint64_t n) { used_.fetch_sub(n, std::memory_order_relaxed); }
  std::uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  std::uint64_t limit() const { return limit_; }

 private:
  const std::uint64_t limit_;
  std::atomic<std::uint64_t> used_{0};
};

}  // namespace ckpt::fs
