#include "fs/store/page_buffer.hpp"

#include <cstdlib>
#include <new>
#include <stdexcept>

namespace ckpt::store {

namespace {
constexpr std::size_t kPage = 4096;
}  // namespace

page_buffer::page_buffer(std::size_t n) : n_(n), cap_(n) {
  if (n == 0) return;
  // aligned_alloc wants a multiple of the alignment; the slack past n is never used.
  p_ = static_cast<std::byte*>(std::aligned_alloc(kPage, (n + kPage - 1) / kPage * kPage));
  if (!p_) throw std::bad_alloc();
}

void page_buffer::resize_within(std::size_t n) {
  if (n > cap_) throw std::length_error("page_buffer: size beyond capacity");
  n_ = n;
}

void page_buffer::release() noexcept {
  std::free(p_);
  p_ = nullptr;
  n_ = 0;
  cap_ = 0;
}

}  // namespace ckpt::store
