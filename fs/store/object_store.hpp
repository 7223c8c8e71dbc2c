#pragma once
// Immutable objects in STORE/objects/: the encoded bytes of stored file versions. An object is
// written once, made durable, and only then referenced from the journal; a crash in between
// leaves an unreferenced object (garbage for gc), never a reference to missing data.
// Objects are streamed: an object_writer takes the payload piece by piece (a checkpoint is
// encoded into its object as it goes, so neither has to fit in memory), writing whole buffers
// through io_uring with O_DIRECT where the filesystem allows it, while the caller encodes the
// next piece. Byte layout: docs/format.md ("Objects").
#include <boost/filesystem/path.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "fs/store/page_buffer.hpp"

namespace ckpt::store {

using object_id = std::uint64_t;
namespace detail {
struct object_dir;
}

struct object_ref {
  object_id id = 0;
  std::uint64_t size = 0;      // payload bytes (what put() was given)
  std::uint64_t checksum = 0;  // XXH3-64 of the payload
};

class object_store;

// One object being written. Nothing is visible until commit(): the bytes go to `<id>.obj.tmp`,
// which a crash leaves for the next open of the store to remove, and which the destructor of a
// writer that was not committed (an error, an exception) removes at once. Not thread-safe; one
// writer per object, any number of writers at once.
class object_writer {
 public:
  object_writer(object_writer&&) noexcept;
  object_writer& operator=(object_writer&&) noexcept;
  ~object_writer();

  // Appends payload bytes (copied: the caller may reuse its buffer at once). Throws io_error
  // (ENOSPC, EIO; the errno is kept) and the writer is then unusable: destroy it.
  void append(std::span<const std::byte> bytes);
  std::uint64_t size() const noexcept;  // payload bytes appended so far
  // Memory its buffers hold: up to two 4 MiB buffers while it is written, none once committed.
  std::size_t buffer_bytes_held() const noexcept;

  // Writes the framing, fdatasyncs, renames to `<id>.obj` (never replacing an existing file) and
  // fsyncs the directory; returns when the object is durable. Throws io_error and leaves no
  // object behind. A failed fsync is never retried: the caller writes the object again from its
  // own data.
  object_ref commit();

 private:
  friend class object_store;
  struct state;
  explicit object_writer(std::unique_ptr<state> s);
  std::unique_ptr<state> s_;
};

class object_store {
 public:
  // Opens (creating if needed) `dir`; ids continue after the largest existing one. Removes the
  // `.obj.tmp` leftovers of a crashed put, so open it only while holding the store_lock (or
  // offline). Ids of removed objects above the largest present one may be reused.
  explicit object_store(boost::filesystem::path dir);

  // Writes the concatenation of `pieces` as a new object and returns when it is durable (data
  // and directory entry fsynced): begin(), append() of each piece, commit(). On failure (ENOSPC,
  // EIO...) throws ckpt::io_error with the errno and leaves no object behind. Thread-safe. Cost:
  // one fdatasync + rename + directory fsync per object (~0.4 ms for a 4 KiB object on the dev
  // VM's ext4), so group small things into one object rather than one object each.
  object_ref put(std::span<const std::span<const std::byte>> pieces);

  // A new object written piece by piece (see object_writer). Throws io_error when the temporary
  // file cannot be created. Thread-safe.
  object_writer begin();

  // Reads payload bytes [offset, offset + out.size()). Throws corrupt_error if the object is
  // missing, truncated or its framing is damaged, or if the range is past the payload; io_error
  // for OS errors. Thread-safe. Each call opens the file and checks the header and footer
  // (open + fstat + 3 preads); it does not recompute the payload checksum (verify() does; the
  // codec's blocks carry their own). Callers reading many small ranges should read larger ones.
  void read(object_id id, std::uint64_t offset, std::span<std::byte> out) const;

  // Like read(), for a large range that is decoded once (a tensor frame): unless the page cache
  // holds all of [offset, offset + len) (cachestat(2); an object written moments ago), it is
  // read with O_DIRECT, so the disk writes it straight into `scratch` and the CPU copies nothing
  // (nor fills the page cache with bytes that are about to be decoded into a cache of their
  // own); a range that is cached is copied as read() would. Filesystems without O_DIRECT get
  // read(). `scratch` is reallocated
  // when too small and reused otherwise; returns the bytes inside it. Same errors as read().
  std::span<const std::byte> read_uncached(object_id id, std::uint64_t offset, std::size_t len,
                                           page_buffer& scratch) const;

  // Asks the kernel to start reading the objects into the page cache (posix_fadvise WILLNEED),
  // all at once, and returns without waiting: objects whose file is at most `tail` bytes and a
  // page whole, larger ones their first page and last `tail` bytes (a content object's
  // metadata trailer). A hint for callers about to read many objects one after another (a cold
  // chain's metadata): their reads then find the bytes in flight or cached instead of waiting
  // for the disk one object at a time. Objects that are missing or cannot be opened are
  // skipped (read() reports them); nothing but std::bad_alloc is thrown.
  void prefetch(std::span<const object_id> ids, std::uint64_t tail) const;

  // Recomputes the payload checksum; throws corrupt_error on mismatch.
  void verify(const object_ref& ref) const;

  // Never hand out ids <= `id` again. The journal may still name removed objects (a version
  // reclaimed after the last compaction); if their ids were reused, replaying that record could
  // reclaim the new object. The content store calls this with the largest id its records name.
  void reserve_through(object_id id);

  void remove(object_id id);                     // missing is not an error
  std::vector<object_id> list() const;           // every object present, ascending
  std::uint64_t disk_bytes(object_id id) const;  // on-disk size incl. framing (0 if missing)

 private:
  struct impl;
  std::shared_ptr<detail::object_dir> shared_dir() const;  // for the writers
  boost::filesystem::path dir_;
  // Directory fd and the id counter. A shared_ptr binds its deleter where impl is complete (in
  // object_store.cpp), so the class needs no user-declared destructor; copies of an object_store
  // are handles to the same store (same counter), which keeps ids unique across them.
  std::shared_ptr<impl> impl_;
};

}  // namespace ckpt::store
