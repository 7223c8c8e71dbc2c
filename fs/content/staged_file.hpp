#pragma once
// The bytes of a file on its way into the store, as the filesystem holds them (its write buffer:
// memory up to buffer=, an unlinked staging file beyond). The content store reads them to encode
// the version and, for a large checkpoint, turns them into the lineage's head image instead of
// writing the reconstruction a second time: it overwrites each tensor payload with its
// reconstruction and each zip CRC field with the served CRC, so that the staged bytes become
// exactly what the new version reads as (head_store.hpp). Defined here, implemented by
// fs/namespace's write_buffer: the content store never sees how the bytes are held.
//
// Thread safety: read_fully() and copy_memory_to_file() may run concurrently with each other; the
// other calls need exclusive access (the head image's lock provides it).
#include <cstdint>
#include <span>

namespace ckpt::fs {

class staged_file {
 public:
  virtual ~staged_file() = default;

  virtual std::uint64_t size() const = 0;
  // All of [offset, offset + out.size()) (inside size()). Throws io_error.
  virtual void read_fully(std::uint64_t offset, std::span<std::byte> out) const = 0;
  // Replaces bytes in place, inside size(). Throws io_error. Marks the file modified().
  virtual void overwrite(std::uint64_t offset, std::span<const std::byte> data) = 0;
  // True once overwrite() changed anything: the bytes are no longer what the user wrote.
  virtual bool modified() const = 0;

  // The backing file (an unlinked file in the staging directory), created if there is none yet
  // and sized to size(); its descriptor stays owned by this object. Throws io_error.
  virtual int backing_file() = 0;
  // Writes the bytes held in memory into the backing file (after backing_file()). Throws
  // io_error (ENOSPC...). Reads may run meanwhile: the memory is only read.
  virtual void copy_memory_to_file() const = 0;
  // After copy_memory_to_file(): frees the memory; every byte is read from the file from now on.
  virtual void drop_memory() = 0;
  virtual std::uint64_t memory_bytes() const = 0;
};

}  // namespace ckpt::fs
