#pragma once
// The codec's per-thread working memory: symbol arrays, byte planes, escape lists and entropy
// coder buffers, kept by every thread that codes or decodes a block and sized by the largest block
// it handled, so that the next block does not fault in fresh pages (that cost more than the
// coding). It is freed only when its thread exits, so a process holds about one set (up to ~5 MiB
// at the default 1 MiB blocks) per thread that ever coded: oneTBB's workers, and every thread that
// called in. scratch_bytes() counts them, so a budget can charge what the thread count makes of it
// (the daemon's: DESIGN.md §9 invariant 7).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace ckpt::codec {

// Bytes of per-thread scratch currently allocated by live threads (capacities, not sizes).
std::uint64_t scratch_bytes() noexcept;
// Threads currently holding any.
std::uint64_t scratch_threads() noexcept;

namespace detail {
void note_scratch(std::int64_t delta_bytes) noexcept;
}  // namespace detail

// Counts one thread-local buffer in scratch_bytes(): set() it to the buffer's capacity whenever
// that changes; it counts nothing once destroyed. For per-thread buffers outside the codec that
// live as the codec's do (the read path's frame buffers).
class scratch_account {
 public:
  scratch_account() = default;
  scratch_account(const scratch_account&) = delete;
  scratch_account& operator=(const scratch_account&) = delete;
  ~scratch_account() { set(0); }
  void set(std::size_t bytes) noexcept {
    if (bytes == counted_) return;
    detail::note_scratch(std::int64_t(bytes) - std::int64_t(counted_));
    counted_ = bytes;
  }

 private:
  std::size_t counted_ = 0;
};

// A std::vector for thread_local scratch whose capacity is counted in scratch_bytes(). The
// growing members are wrapped; code that grows it through a std::vector& calls note() after.
template <class T>
class scratch_vector : public std::vector<T> {
  using base = std::vector<T>;

 public:
  void resize(std::size_t n) {
    base::resize(n);
    note();
  }
  void push_back(const T& v) {
    base::push_back(v);
    note();
  }
  template <class It>
  void assign(It first, It last) {
    base::assign(first, last);
    note();
  }
  void note() noexcept { account_.set(base::capacity() * sizeof(T)); }

 private:
  scratch_account account_;
};

// A grow-only uninitialised buffer for thread_local scratch, counted in scratch_bytes().
class scratch_buffer {
 public:
  // At least n bytes; contents unspecified (kept only while n does not grow).
  std::uint8_t* get(std::size_t n) {
    if (n > size_) {
      p_ = std::make_unique_for_overwrite<std::uint8_t[]>(n);
      size_ = n;
      account_.set(n);
    }
    return p_.get();
  }

 private:
  std::unique_ptr<std::uint8_t[]> p_;
  std::size_t size_ = 0;
  scratch_account account_;
};

}  // namespace ckpt::codec
