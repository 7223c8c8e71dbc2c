#include "fs/namespace/memory_budget.hpp"

#include <sys/mman.h>

#include <new>
#include <utility>

namespace ckpt::fs {

chunk_memory chunk_memory::allocate() {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  chunk_memory c;
  c.p_ = static_cast<std::byte*>(p);
  return c;
}

chunk_memory& chunk_memory::operator=(chunk_memory&& o) noexcept {
  if (this != &o) {
    if (p_) ::munmap(p_, bytes);
    p_ = std::exchange(o.p_, nullptr);
  }
  return *this;
}

chunk_memory::~chunk_memory() {
  if (p_) ::munmap(p_, bytes);
}

chunk_memory memory_budget::take_chunk() {
  {
    std::lock_guard lk(pool_mu_);
    if (!pool_.empty()) {
      chunk_memory c = std::move(pool_.back());
      pool_.pop_back();
      return c;
    }
  }
  return chunk_memory::allocate();
}

void memory_budget::recycle(chunk_memory chunk) {
  if (!chunk) return;
  // The kernel may take the pages back under memory pressure (they then read as zeros, which
  // is fine: buffers never rely on a chunk's old contents).
  ::madvise(chunk.data(), chunk_memory::bytes, MADV_FREE);
  std::lock_guard lk(pool_mu_);
  pool_.push_back(std::move(chunk));
}

std::size_t memory_budget::pooled_chunks() const {
  std::lock_guard lk(pool_mu_);
  return pool_.size();
}

void memory_budget::trim() {
  std::vector<chunk_memory> doomed;
  {
    std::lock_guard lk(pool_mu_);
    doomed.swap(pool_);
  }
}

}  // namespace ckpt::fs
