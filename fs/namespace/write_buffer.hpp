#pragma once
// The bytes of a file being written: writes at any offset, reads, truncate. Held in 1 MiB chunks.
// A chunk lives in memory while the shared memory_budget has room; chunks written when it has
// none go to an anonymous staging file (O_TMPFILE in STORE/staging, so a crash leaves nothing
// behind), at their own offsets. Chunks already in memory stay there (a file a little larger than
// the budget costs a little disk I/O, not a copy of everything), except while a stream follows
// the file: chunks it is done with then move to the file to make room (settle()), else, when it
// is done with none in memory, the newest full chunk (the one it reads last). Chunks are kept
// in a sparse map: holes cost nothing, whatever the file size (a truncate to 1 TiB is one number).
//
// Thread safety: every call locks the buffer (shared for reads), so the content store may read
// a file it streams (staged_file, "Streaming writes") while the filesystem writes it. The owner
// still serialises its own modifications.
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
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "codec/format/source.hpp"
#include "fs/content/content_store.hpp"
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

  // Copy-on-write over a stored version: instead of loading the file, the buffer starts as
  // `base` (its reader, `size` bytes, data in `base_runs`) and holds only the chunks written
  // since; the rest is read from the base on demand. Opening a large file to change a few bytes
  // then costs the bytes touched, and the store reuses the unchanged blocks (unchanged()). Only
  // on an empty buffer.
  void set_base(std::shared_ptr<const content_reader> base, std::uint64_t version,
                std::vector<std::pair<std::uint64_t, std::uint64_t>> base_runs);

  // Throws ckpt::io_error (e.g. ENOSPC from the staging file).
  void write(std::uint64_t offset, std::span<const std::byte> data);
  // Like pread: min(out.size(), size() - offset) bytes.
  std::size_t read(std::uint64_t offset, std::span<std::byte> out) const;
  void truncate(std::uint64_t size);
  // Makes [offset, offset + length) read as zeros without changing the size: whole chunks inside
  // the range become holes (their memory or staging space is given back), partial ones are zeroed.
  void punch_hole(std::uint64_t offset, std::uint64_t length);
  // [offset, end) runs that may hold data, ascending and disjoint, clipped to size(); everything
  // else reads as zeros. Granularity is the chunk: a run may include zeros, never miss data.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> data_runs() const override;
  // Bytes of chunks that hold data (st_blocks).
  std::uint64_t allocated_bytes() const;

  // A source over the current bytes; valid while this buffer lives and is not modified.
  format::source source() const;

  // staged_file (see there for the contract).
  void read_fully(std::uint64_t offset, std::span<std::byte> out) const override;
  void overwrite(std::uint64_t offset, std::span<const std::byte> data) override;
  bool modified() const override { return modified_.load(); }
  int backing_file() override;
  void copy_memory_to_file() const override;
  void drop_memory() override;
  std::uint64_t memory_bytes() const override { return taken_; }
  unchanged_ranges unchanged() const override;

  // Streaming (staged_file). Bytes [0, contiguous()) are all written: sequential writes from the
  // start (out of order too, within a bound); a buffer over a base version never streams.
  std::uint64_t contiguous() const;
  bool streamable() const;  // written from its start, no base, nothing odd yet
  void no_stream();         // never streams (not a checkpoint it could follow)
  void begin_stream();
  void complete_stream() override;
  bool await_complete() override;
  void cancel_stream() override;
  void end_stream() override;
  bool await(std::uint64_t end) override;
  bool stale() const override;
  void settle(std::uint64_t end) override;
  // Called by the writer before write(offset, n bytes), without the filesystem's lock: while a
  // stream follows this buffer and is behind it, and the write needs a chunk the budget has no
  // room for, waits until the stream settles one of this buffer's chunks in memory (settle()),
  // whose memory the write then reuses, instead of spilling the write's bytes raw. Returns at
  // once when waiting cannot give memory back: no stream, a stale one, a stream waiting for
  // bytes itself (a writer out of order), no chunk of this buffer in memory ahead of the
  // stream. A wait that sees the stream settle nothing for kRoomWait ends waiting until the
  // stream settles more: meanwhile the buffer spills as it did before streams.
  void wait_for_room(std::uint64_t offset, std::size_t n);

 private:
  // The unlocked bodies of the public calls (mu_ held by the caller).
  void write_locked(std::uint64_t offset, std::span<const std::byte> data);
  std::size_t read_locked(std::uint64_t offset, std::span<std::byte> out) const;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> data_runs_locked() const;
  void note_written(std::uint64_t offset, std::uint64_t end);  // the contiguous mark
  // While streaming: a user write over [offset, offset + data.size()) that changes bytes the
  // stream read makes it stale.
  void check_stream_overlap(std::uint64_t offset, std::span<const std::byte> data);
  // A chunk in chunks_ is the buffer's own: in memory, in the staging file, or neither (a hole
  // punched over the base). A chunk not in chunks_ reads from the base below base_limit_, else
  // as zeros.
  struct chunk {
    chunk_memory mem;        // in memory (else in the staging file, or a hole)
    std::size_t filled = 0;  // memory chunks: bytes [0, filled) are data, the rest reads as zeros
    bool in_file = false;    // lives in the staging file at its own offset
    bool direct = false;     // in_file, written by direct I/O: read the same way
  };
  chunk& place(std::uint64_t index);  // gives an untouched chunk memory, or a place in the file
  // A chunk in memory wholly below settled_ (the stream is done with it), whose memory a new
  // chunk may take once its bytes are in the staging file; none: chunks_.end().
  std::map<std::uint64_t, chunk>::iterator settled_chunk();
  // For a file no stream follows (none yet, or it ended; reusable_chunk() tells): its lowest
  // chunk in memory that is full, whose memory a new chunk may take once it is in the staging file
  // (whole, by direct I/O); none: chunks_.end(). Without it the bytes past the budget went to the
  // staging file piece by piece through the page cache (a DCP shard, a safetensors file,
  // `stream=off`), which cost more CPU than their encode (docs/benchmarks.md, "Files no stream
  // follows").
  std::map<std::uint64_t, chunk>::iterator full_chunk();
  // While a stream follows the file and has settled no chunk in memory (it is far behind its
  // writer, or still walking a DCP shard's first tensors before it codes): the newest full
  // chunk in memory, among the last few chunks; none: chunks_.end(). Its bytes are the ones
  // the stream reads last, so memory keeps those it reads next, and the file gets whole chunks
  // by direct I/O instead of the writer's pieces through the page cache (a raw spill: its
  // copies were 37% of the daemon's CPU while 8 writers saved DCP shards with heads=off;
  // docs/benchmarks.md, "DCP shards streamed with head images off").
  std::map<std::uint64_t, chunk>::iterator newest_full_chunk();
  // The one of the above that applies: a stream follows the file (settled_chunk(), else
  // newest_full_chunk()), or not (full_chunk()).
  std::map<std::uint64_t, chunk>::iterator reusable_chunk();
  // Writes `old` (reusable_chunk()) to the staging file and keeps its memory in spare_.
  void make_spare(std::map<std::uint64_t, chunk>::iterator old);
  void drop_chunk(chunk& c);  // gives back its memory or staging space
  // Writes a memory chunk's bytes to its place in the staging file (fd_ open): whole chunks
  // by direct I/O where the file allows it (then true), else through the page cache.
  bool write_to_file(std::uint64_t index, const chunk& c) const;
  bool from_base(std::uint64_t index) const;  // not own, and below base_limit_
  chunk& own(std::uint64_t index);            // place(), filled from the base if it read from it
  void materialize_base();                    // every chunk that reads from the base becomes own
  void open_staging();
  void uncount_spill(std::uint64_t n);  // at most spilled_: the budget never goes below zero

  std::shared_ptr<memory_budget> budget_;
  std::string staging_dir_;
  std::map<std::uint64_t, chunk> chunks_;  // by chunk index; absent: a hole
  std::uint64_t taken_ = 0;                // bytes taken from the budget
  chunk_memory spare_;  // a settled chunk's memory for the next new chunk (counted in taken_)
  // Bytes of chunks placed in the staging file, as counted in budget_->spilled(); drop_memory()
  // hands them over to the head image (the file is its image from then on).
  std::uint64_t spilled_ = 0;
  int fd_ = -1;   // the staging file, once a chunk needed it
  int dfd_ = -1;  // the same file opened for direct I/O (O_DIRECT), or -1 where not supported
  std::uint64_t size_ = 0;
  std::atomic<bool> modified_{false};  // overwritten in place by the content store
  std::shared_ptr<const content_reader> base_;
  std::uint64_t base_version_ = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> base_runs_;  // data runs of the base
  std::uint64_t base_limit_ = 0;  // base bytes still visible (a truncate below lowers it)

  mutable std::shared_mutex mu_;
  mutable std::condition_variable_any written_cv_;  // streaming: more bytes, or the stream ended
  // Streaming. contiguous_: [0, contiguous_) written; ahead_: written runs past it (from, end),
  // at most kAheadMax of them, else the buffer is no longer streamable.
  static constexpr std::size_t kAheadMax = 4096;
  static constexpr auto kRoomWait = std::chrono::seconds(1);
  std::uint64_t contiguous_ = 0;
  std::map<std::uint64_t, std::uint64_t> ahead_;
  bool unstreamable_ = false;
  // none -> open -> complete or cancelled -> done (end_stream: the stream's reader is gone).
  enum class stream_state { none, open, complete, cancelled, done };
  std::atomic<stream_state> stream_{stream_state::none};  // changed under mu_
  mutable std::uint64_t consumed_ = 0;                    // the stream read everything below this
  std::uint64_t settled_ = 0;  // the stream is done with everything below this (settle())
  bool stream_waits_ = false;  // the stream is in await() for bytes not written yet
  // A wait_for_room() timed out with the stream settled to here: none until it settles more.
  std::optional<std::uint64_t> no_wait_until_past_;
  mutable std::condition_variable_any room_cv_;  // settled_ moved, or the stream ended
  std::uint64_t evicted_below_ = 0;  // chunk index: no settled chunk below it is in memory
  bool stale_ = false;
};

}  // namespace ckpt::fs
