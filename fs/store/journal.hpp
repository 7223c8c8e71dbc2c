#pragma once
// The store's metadata journal (STORE/journal): an append-only sequence of records, each framed
// with its length and a checksum. The namespace and the content index both write their records
// here, so one sync() commits a file version and the name that points at it together.
// Crash rule: replay() returns the longest intact prefix and truncates a torn tail; a record is
// durable once the sync() after its append() returned. Byte layout: docs/format.md ("Journal").
#include <boost/filesystem/path.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace ckpt::store {

class journal {
 public:
  explicit journal(boost::filesystem::path file);
  journal(const journal&) = delete;
  journal& operator=(const journal&) = delete;
  ~journal();  // best-effort sync of pending records (errors swallowed; only sync() promises)

  // Calls `apply` for every intact record in order, then drops any torn or damaged tail so that
  // new records follow the last good one. Must be called once, before the first append().
  void replay(const std::function<void(std::span<const std::byte>)>& apply);

  // What replay() dropped: `bytes` after the last intact record at `offset` (0 bytes: nothing,
  // the journal was whole). A tail a crash tore while it was being written, or records after a
  // damaged one: replay cannot tell them apart, so what is not all zeros is first kept, durably,
  // in the file `kept` (JOURNAL.tail-<offset>-<unix time>; empty when nothing was kept). Whoever
  // opened the store decides what to say and what not to do (store_session: no sweep of unrecorded
  // objects, whose records may be in that tail).
  struct dropped_tail {
    std::uint64_t offset = 0;
    std::uint64_t bytes = 0;
    std::string kept;
  };
  const dropped_tail& tail() const noexcept { return tail_; }

  // Appends a record (buffered). Thread-safe; records keep the order of the calls.
  void append(std::span<const std::byte> record);

  // Makes every record appended so far durable (write + fdatasync). Throws ckpt::io_error; after
  // a failed sync the journal refuses further appends (fsyncgate: the state on disk is unknown).
  void sync();

  // Atomically replaces the journal's contents by `records` (a snapshot of the live state):
  // write a new file, fsync it, rename it over the journal, fsync the directory.
  // In two steps, so that a caller holds its metadata lock only while it takes the snapshot and
  // not across the file's fsyncs:
  //   auto cut = j.begin_compact();   // under the caller's lock, where the snapshot is taken
  //   j.finish_compact(std::move(cut), records);   // without it
  // The snapshot supersedes every record appended before begin_compact(), synced or not;
  // records appended after it are kept and follow the snapshot in the new file (a sync() after
  // finish_compact() makes them durable). Between the two calls the compaction holds the sync
  // lock: sync() waits, so no record can be made durable in the file about to be replaced.
  // A successful compaction also clears a failed sync (the new file is a known state); a
  // failure leaves the old journal in place with every record still pending.
  class compaction {
   public:
    compaction() = default;

   private:
    friend class journal;
    std::unique_lock<std::mutex> sync_lock_;
    std::size_t cut_ = 0;  // bytes of pending_ the snapshot supersedes
  };
  compaction begin_compact();
  void finish_compact(compaction cut, const std::vector<std::vector<std::byte>>& records);
  // Both at once: the caller keeps appends out meanwhile.
  void compact(const std::vector<std::vector<std::byte>>& records);

  // Current file size including records appended but not yet synced, to decide when to compact.
  std::uint64_t size_bytes() const;

 private:
  boost::filesystem::path file_;
  mutable std::mutex mu_;  // guards everything below except the I/O itself
  std::mutex sync_mu_;     // serialises sync() and compact(); taken before mu_, never after
  int fd_ = -1;
  std::vector<std::byte> pending_;  // framed records appended since the last sync
  std::uint64_t end_ = 0;           // file size once pending_ is written
  bool replayed_ = false;
  bool failed_ = false;
  dropped_tail tail_;
};

}  // namespace ckpt::store
