#pragma once
// Encoded bytes on their way into a content object, parked in an unlinked file instead of
// memory. An exact region is as large as the file a user copied in (a 10 GB dataset would
// otherwise need its encoded size in RAM until its object is written); the object write then
// reads the bytes back through a read-only mapping, i.e. from the page cache, which the kernel
// can reclaim, not from anonymous memory, which it cannot.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "fs/store/posix.hpp"

namespace ckpt::fs {

class spill_file {
 public:
  // An O_TMPFILE in `dir` (a named file unlinked at once where the filesystem lacks O_TMPFILE).
  // Throws io_error naming the directory.
  explicit spill_file(const std::string& dir);

  // Appends at the end; returns the offset the bytes start at. Throws io_error (ENOSPC, ...).
  std::uint64_t append(std::span<const std::byte> bytes);
  std::uint64_t size() const { return size_; }

  // A read-only view of the whole file as it is now; unmapped on destruction.
  class mapping {
   public:
    explicit mapping(const spill_file& f);
    ~mapping();
    mapping(const mapping&) = delete;
    mapping& operator=(const mapping&) = delete;
    std::span<const std::byte> bytes() const { return {data_, size_}; }

   private:
    const std::byte* data_ = nullptr;
    std::size_t size_ = 0;
  };

 private:
  store::detail::unique_fd fd_;
  std::uint64_t size_ = 0;
};

}  // namespace ckpt::fs
