#pragma once
// The bytes of a file being written: writes at any offset, reads, truncate. Held in 1 MiB chunks.
// A chunk lives in memory while the shared memory_budget has room; chunks written when it has
// none go to an anonymous staging file (O_TMPFILE in STORE/staging, so a crash leaves nothing
// behind), at their own offsets. Chunks already in memory stay there: a file a little larger than
// the budget costs a little disk I/O, not a copy of everything. Holes cost nothing. Not
// thread-safe: the owner serialises access.
//
// Chunks in the staging file are counted in the budget (memory_budget::spilled, for `ckptctl
// status`) while this buffer holds them as a write buffer.
//
// A memory chunk's bytes past its `filled` mark read as zeros without being cleared (recycled
// chunks hold old data), so sequential writes never memset: only a gap a write skips is zeroed.
//
// As a staged_file (fs/content/staged_file.hpp), a finished buffer is handed to the content
// store, which may rewrite it in place into the head image of a checkpoint lineage, move its
// memory into the staging file and keep that file.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "codec/format/source.hpp"
#include "fs/content/staged_file.hpp"
#include "fs/namespace/memory_budget.hpp"

namespace ckpt::fs {

class write_buffer final : public staged_file {
 public:
  static constexpr std::size_t chunk_bytes = chunk_memory::bytes;

  // The budget is shared: a buffer the content store keeps as a head image may outlive the
  // filesystem that made it.
  write_buffer(std::shared_ptr<memory_budget> budget, std::string staging_dir);
  ~write_buffer() override;
  write_buffer(const write_buffer&) = delete;
  write_buffer& operator=(const write_buffer&) = delete;

  std::uint64_t size() const override { return size_; }
  bool spilled() const { return fd_ >= 0; }  // some chunks are in the staging file

  // Throws ckpt::io_error (e.g. ENOSPC from the staging file).
  void write(std::uint64_t offset, std::span<const std::byte> data);
  // Like pread: min(out.size(), size() - offset) bytes.
  std::size_t read(std::uint64_t offset, std::span<std::byte> out) const;
  void truncate(std::uint64_t size);

  // A source over the current bytes; valid while this buffer lives and is not modified.
  format::source source() const;

  // staged_file (see there for the contract).
  void read_fully(std::uint64_t offset, std::span<std::byte> out) const override;
  void overwrite(std::uint64_t offset, std::span<const std::byte> data) override;
  bool modified() const override { return modified_; }
  int backing_file() override;
  void copy_memory_to_file() const override;
  void drop_memory() override;
  std::uint64_t memory_bytes() const override { return taken_; }

 private:
  struct chunk {
    chunk_memory mem;        // in memory (else in the staging file, or a hole)
    std::size_t filled = 0;  // memory chunks: bytes [0, filled) are data, the rest reads as zeros
    bool in_file = false;    // lives in the staging file at its own offset
  };
  chunk& place(std::size_t index);  // gives an untouched chunk memory, or a place in the file
  void open_staging();
  void uncount_spill(std::uint64_t n);  // at most spilled_: the budget never goes below zero

  std::shared_ptr<memory_budget> budget_;
  std::string staging_dir_;
  std::vector<chunk> chunks_;
  std::uint64_t taken_ = 0;  // bytes taken from the budget
  // Bytes of chunks placed in the staging file, as counted in budget_->spilled(); drop_memory()
  // hands them over to the head image (the file is its image from then on).
  std::uint64_t spilled_ = 0;
  int fd_ = -1;  // the staging file, once a chunk needed it
  std::uint64_t size_ = 0;
  bool modified_ = false;  // overwritten in place by the content store
};

}  // namespace ckpt::fs
