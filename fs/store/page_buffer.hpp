#pragma once
// A large byte buffer that its user fills before reading it (decode targets, frames read from
// objects). Contract: the contents start undefined (never zero-filled in user space: zeroing a
// gigabyte, and faulting it in, cost as much as decoding it); data() is page-aligned, so the
// buffer can be the target of an O_DIRECT read. Move-only.
//
// No transparent huge pages: on the benchmark VM a fresh huge page cost 3-8x more to fault in
// than 512 small ones (the kernel zeroes it at 0.35-1.5 GB/s, memory the host has not backed
// yet), and a daemon after a remount has only fresh memory (docs/benchmarks.md).
#include <cstddef>
#include <span>
#include <utility>

namespace ckpt::store {

class page_buffer {
 public:
  page_buffer() = default;
  explicit page_buffer(std::size_t n);  // throws std::bad_alloc
  page_buffer(page_buffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)),
        n_(std::exchange(o.n_, 0)),
        cap_(std::exchange(o.cap_, 0)) {}
  page_buffer& operator=(page_buffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
      cap_ = std::exchange(o.cap_, 0);
    }
    return *this;
  }
  page_buffer(const page_buffer&) = delete;
  page_buffer& operator=(const page_buffer&) = delete;
  ~page_buffer() { release(); }

  std::byte* data() noexcept { return p_; }
  const std::byte* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  // Bytes allocated: a recycled buffer (fs/content/buffer_pool) is reused for any size up to it.
  std::size_t capacity() const noexcept { return cap_; }
  // Sets size() to n <= capacity() without reallocating; the contents stay as they were.
  void resize_within(std::size_t n);  // throws std::length_error beyond capacity()
  operator std::span<std::byte>() noexcept { return {p_, n_}; }
  operator std::span<const std::byte>() const noexcept { return {p_, n_}; }

 private:
  void release() noexcept;
  std::byte* p_ = nullptr;
  std::size_t n_ = 0;
  std::size_t cap_ = 0;
};

}  // namespace ckpt::store
