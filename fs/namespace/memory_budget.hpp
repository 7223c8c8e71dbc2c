#pragma once
// The `buffer=` budget: bytes of write buffers held in memory by all open files together. A
// buffer that cannot get more spills to a staging file instead of failing.
//
// It also recycles the 1 MiB chunks buffers are made of. Fresh anonymous memory costs a page
// fault and a kernel page clear per 4 KiB, which made those the largest cost of writing through
// the mount. Returned chunks are kept (marked MADV_FREE, so the kernel may still reclaim them
// under memory pressure) and handed out again: chunk memory never exceeds the budget's high-water
// mark, and the next checkpoint is written into pages that are already mapped.
//
// For `ckptctl status` it also counts what did not fit: bytes of write-buffer chunks placed in
// staging files (note_spilled / note_unspilled, called by write_buffer). Relaxed atomics: the
// numbers are a snapshot for people, never a decision.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace ckpt::fs {

// The constant of DESIGN.md §9 invariant 7 (issue 13): the daemon's resident memory is to stay
// under cache= + buffer= + this, whatever the input. `ckptctl status` shows the bound.
inline constexpr std::uint64_t daemon_overhead_bytes = std::uint64_t(512) << 20;

// One page-aligned, mmap'ed chunk of write-buffer memory. Contents are unspecified when taken.
class chunk_memory {
 public:
  static constexpr std::size_t bytes = std::size_t(1) << 20;

  chunk_memory() = default;
  static chunk_memory allocate();  // throws std::bad_alloc
  chunk_memory(chunk_memory&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  chunk_memory& operator=(chunk_memory&& o) noexcept;
  chunk_memory(const chunk_memory&) = delete;
  chunk_memory& operator=(const chunk_memory&) = delete;
  ~chunk_memory();

  std::byte* data() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  std::byte* p_ = nullptr;
};

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

  // Bytes of write-buffer chunks that live in staging files instead (whole 1 MiB chunks, so an
  // upper bound of their disk bytes), until their buffer frees them or becomes a published
  // head image (head images are counted by the head store, on disk). Never below zero.
  void note_spilled(std::uint64_t n) { spilled_.fetch_add(n, std::memory_order_relaxed); }
  void note_unspilled(std::uint64_t n) { spilled_.fetch_sub(n, std::memory_order_relaxed); }
  std::uint64_t spilled() const { return spilled_.load(std::memory_order_relaxed); }

  // Chunk memory for a buffer that took chunk_memory::bytes; recycle() when done with it.
  chunk_memory take_chunk();
  void recycle(chunk_memory chunk);
  std::size_t pooled_chunks() const;
  void trim();  // frees every pooled chunk

 private:
  const std::uint64_t limit_;
  std::atomic<std::uint64_t> used_{0};
  std::atomic<std::uint64_t> spilled_{0};
  mutable std::mutex pool_mu_;
  std::vector<chunk_memory> pool_;
};

}  // namespace ckpt::fs
