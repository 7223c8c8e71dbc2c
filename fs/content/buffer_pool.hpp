#pragma once
// Recycled buffers for decoded chunks of a cold read. On the benchmark VM a page the daemon has
// not touched before costs 0.5-0.8 s of CPU per GiB to fault in (the host backs it on first
// touch), as much as decoding into it; a cold torch.load of 1 GiB through a few MiB of chunk
// buffers that are reused instead of freed touches fresh memory only for the first few.
//
// take(n) hands out a pooled buffer (capacity buffer_bytes, size n) when n is at least half of
// buffer_bytes, and a fresh exact-size one otherwise (small tensors are not worth a large
// buffer). give() keeps pool-sized buffers, up to max_free of them, and frees the rest.
// Thread-safe.
#include <cstddef>
#include <mutex>
#include <vector>

#include "fs/store/page_buffer.hpp"

namespace ckpt::fs {

class buffer_pool {
 public:
  buffer_pool(std::size_t buffer_bytes, std::size_t max_free);

  store::page_buffer take(std::size_t n);  // throws std::bad_alloc
  void give(store::page_buffer&& b) noexcept;

  std::size_t buffer_bytes() const noexcept { return buffer_bytes_; }
  std::size_t free_count() const;

 private:
  const std::size_t buffer_bytes_, max_free_;
  mutable std::mutex mu_;
  std::vector<store::page_buffer> free_;  // capacity max_free_: give() never allocates
};

}  // namespace ckpt::fs
