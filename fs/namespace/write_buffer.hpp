#pragma once
// The bytes of a file being written: writes at any offset, reads, truncate. Held in 1 MiB chunks
// taken from a shared memory_budget (holes cost nothing); when the budget is exhausted the whole
// buffer moves to an anonymous staging file (O_TMPFILE in STORE/staging, so a crash leaves
// nothing behind) and stays there. Not thread-safe: the owner serialises access.
//
// A chunk's bytes past its `filled` mark read as zeros without being cleared (recycled chunks
// hold old data), so sequential writes never memset: only a gap a write skips is zeroed.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "codec/format/source.hpp"
#include "fs/namespace/memory_budget.hpp"

namespace ckpt::fs {

class write_buffer {
 public:
  static constexpr std::size_t chunk_bytes = chunk_memory::bytes;

  write_buffer(memory_budget& budget, std::string staging_dir);
  ~write_buffer();
  write_buffer(const write_buffer&) = delete;
  write_buffer& operator=(const write_buffer&) = delete;

  std::uint64_t size() const { return size_; }
  bool spilled() const { return fd_ >= 0; }

  // Throws ckpt::io_error (e.g. ENOSPC from the staging file).
  void write(std::uint64_t offset, std::span<const std::byte> data);
  // Like pread: min(out.size(), size() - offset) bytes.
  std::size_t read(std::uint64_t offset, std::span<std::byte> out) const;
  void truncate(std::uint64_t size);

  // A source over the current bytes; valid while this buffer lives and is not modified.
  format::source source() const;

 private:
  void spill();
  void ensure_chunk(std::size_t index);

  memory_budget& budget_;
  std::string staging_dir_;
  struct chunk {
    chunk_memory mem;        // empty = a hole (reads as zeros)
    std::size_t filled = 0;  // bytes [0, filled) are data; the rest reads as zeros
  };
  std::vector<chunk> chunks_;
  std::uint64_t taken_ = 0;  // bytes taken from the budget
  int fd_ = -1;              // staging file once spilled
  std::uint64_t size_ = 0;
};

}  // namespace ckpt::fs
