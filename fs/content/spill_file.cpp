#include "fs/content/spill_file.hpp"

#include <sys/mman.h>

#include "fs/store/posix.hpp"

namespace ckpt::fs {

using store::detail::throw_errno;

spill_file::spill_file(const std::string& dir) : fd_(store::detail::open_unlinked(dir, "spill")) {}

std::uint64_t spill_file::append(std::span<const std::byte> bytes) {
  const std::uint64_t at = size_;
  store::detail::pwrite_all(fd_.get(), bytes, at, "spill file write");
  size_ += bytes.size();
  return at;
}

spill_file::mapping::mapping(const spill_file& f) : size_(std::size_t(f.size_)) {
  if (!size_) return;
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, f.fd_.get(), 0);
  if (p == MAP_FAILED) throw_errno(errno, "cannot map a spill file");
  ::madvise(p, size_, MADV_SEQUENTIAL);  // read once, front to back: drop pages behind
  data_ = static_cast<const std::byte*>(p);
}

spill_file::mapping::~mapping() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
}

}  // namespace ckpt::fs
