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
// other calls need exclusive access (the head image's lock provides it). While a stream is open
// (below), the writer's writes may run concurrently with every call (settle() included).
//
// Streaming writes: the content store may encode a file while it is still being written
// (content_store::stream). From the filesystem's begin_stream() until complete_stream() (the
// file is finished) or cancel_stream(), the stream waits for bytes with await() before it
// reads them, and read_fully() remembers how far it read: a later write that changes bytes it
// read makes the stream stale (its encoding of them is out of date), and the store then stores
// the finished file the ordinary way. overwrite() does nothing while the stream is stale, so
// that it never replaces a byte the writer wrote after the store read it.
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

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
  // io_error (ENOSPC...). Reads may run meanwhile: the memory is only read. Not atomic against
  // other calls: the write buffer takes its lock a chunk at a time, so that the stream's last
  // calls need not wait for the whole copy (head images are not written once published).
  virtual void copy_memory_to_file() const = 0;
  // After copy_memory_to_file(): frees the memory; every byte is read from the file from now on.
  virtual void drop_memory() = 0;
  virtual std::uint64_t memory_bytes() const = 0;

  // [offset, end) runs that may hold data, ascending, disjoint, inside size(); the rest reads as
  // zeros. A file that is not a recognised checkpoint is stored as these runs only: holes cost
  // no bytes and no encode time.
  virtual std::vector<std::pair<std::uint64_t, std::uint64_t>> data_runs() const {
    return {{0, size()}};
  }

  // Streaming (see above). await(): waits until [0, end) is written, the file is complete, or
  // the stream is cancelled or stale; true if [0, end) can be read and the stream is still good.
  virtual bool await(std::uint64_t end) { return end <= size(); }
  virtual bool stale() const { return false; }
  // Waits until the file is complete (true) or the stream cancelled (false).
  virtual bool await_complete() { return true; }
  // The file is finished: await() waits no more. Idempotent.
  virtual void complete_stream() {}
  // Stops the stream: waiting await()s return false. Idempotent.
  virtual void cancel_stream() {}
  // After the stream's reader is gone (joined): the buffer is an ordinary staged file again, and
  // overwrite() works even if the stream went stale (a put of the finished file follows).
  virtual void end_stream() {}
  // The stream is done with [0, end): it read those bytes and wrote what replaces them, and only
  // the commit touches them again (the exact regions read, the zip CRC fields overwritten). A
  // buffer short of memory moves such bytes to its backing file to make room for new ones,
  // rather than spill new bytes the stream has still to read (which it would read back from the
  // disk and then overwrite there: each byte through the page cache three times instead of
  // once). Ascending; a smaller end than before is ignored.
  virtual void settle(std::uint64_t end) { (void)end; }

  // A file opened over a stored version and changed in part: that version, and the [offset,
  // end) ranges (ascending, each starting on a 1 MiB boundary) whose bytes are still exactly that
  // version's bytes at the same offsets. An exact file is then stored by reusing the version's
  // encoded blocks there instead of encoding them again. version 0: nothing known.
  struct unchanged_ranges {
    std::uint64_t version = 0;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  };
  virtual unchanged_ranges unchanged() const { return {}; }
};

}  // namespace ckpt::fs
