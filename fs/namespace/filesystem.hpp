#pragma once
// The filesystem the daemon serves, without FUSE: namespace + write buffers + content store +
// journal. Each public method is one FUSE operation's meaning; errors are thrown as
// ckpt::io_error carrying the errno (the FUSE layer's one boundary turns them into replies).
//
// Contracts (see docs/filesystem.md, "Durability"):
// - Every namespace mutation appends one journal record. Records are synced lazily (every
//   `sync_interval`, or after `sync_every` records), and always by fsync, fsyncdir and every
//   file commit.
// - A regular file opened for writing gets a write_buffer (memory up to `buffer_bytes` for all
//   files together, then a staging file). At the release of its last writable handle, if the
//   bytes changed, a worker stores them (content_store::put), then the inode points at the new
//   version (one record), the journal is synced, and the old version is released. Until then the
//   file is *pending*: open, read and getattr wait, so a file never reads as two contents.
// - A failed commit leaves the previous content. Its errno is reported like Linux's errseq_t:
//   once to every handle of the file that was open when it failed (by the handle's next flush or
//   fsync), and to handles opened after it until one of those reported it (see runtime::error).
//   fsync of a file being written commits synchronously and returns its own failure directly.
// - Content versions are released (content_store::unref, which may delete objects) only after
//   the journal records that stopped referencing them are durable: a crash never leaves a name
//   pointing at deleted data.
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "fs/content/content_store.hpp"
#include "fs/namespace/memory_budget.hpp"
#include "fs/namespace/namespace_tree.hpp"
#include "fs/namespace/worker_pool.hpp"
#include "fs/namespace/write_buffer.hpp"
#include "fs/store/journal.hpp"

namespace ckpt::fs {

struct fs_config {
  std::string store_dir;    // statfs reports this filesystem's numbers
  std::string staging_dir;  // spilled write buffers (O_TMPFILE)
  std::uint64_t buffer_bytes = std::uint64_t(1) << 30;
  unsigned commit_threads = 2;
  std::chrono::milliseconds sync_interval{1000};
  std::uint64_t sync_every = 1024;                        // records
  std::uint64_t compact_bytes = std::uint64_t(64) << 20;  // journal size that triggers a snapshot
  // Read-only opens of reconstructed torch checkpoints bypass the kernel page cache: every read
  // is served from the daemon's caches straight into the reader's buffer. A checkpoint is large
  // and usually read once; through the page cache it is copied twice and held twice (page cache
  // and daemon), and on the benchmark VM the fresh page-cache memory cost more than the decode
  // (docs/benchmarks.md). Only torch zips (content_store::direct_read_ok): numpy and
  // safetensors readers map .npy and safetensors files, which kernels before 6.6 refuse for
  // direct-I/O files (fs/fuse/passthrough.hpp). false: through the page cache, kept across opens
  // (keep_cache).
  bool direct_checkpoint_reads = true;
  // Rotation (docs/filesystem.md): once the versions kept only as bases below a lineage's oldest
  // named delta hold this many times the bytes of a keyframe, that delta is rewritten as a
  // keyframe in the background (as `ckptctl prune` does) and the chain below it is freed; so a
  // rewrite writes at most 1/factor of what it frees. 0: never (the daemon sets 1.25, -o reclaim).
  double rewrite_factor = 0;
  // Streaming writes (docs/filesystem.md): a file written from its start that looks like a
  // torch.save archive is encoded while it is written (content_store::start_stream), once this
  // many bytes are in. 0: never (files are encoded after their last byte, at the commit).
  std::uint64_t stream_after = 0;
};

struct open_result {
  std::uint64_t fh = 0;
  bool keep_cache = false;  // the kernel may keep cached pages of this file
  bool direct_io = false;   // bypass the page cache (files being written, checkpoints read)
  bool writable = false;
  std::uint64_t version = 0;  // the content the open starts with (0: empty or being written)
  // Read-only opens of a version with a published head image: its reader, whose backing_fd()
  // the FUSE layer may hand to the kernel (passthrough). Null otherwise.
  std::shared_ptr<const content_reader> image;
};

struct dir_entry {
  std::string name;
  ino_t ino = 0;
  std::uint32_t mode = 0;
};

class filesystem {
 public:
  filesystem(store::journal& journal, content_store& content, fs_config cfg);
  ~filesystem();  // shutdown()
  filesystem(const filesystem&) = delete;
  filesystem& operator=(const filesystem&) = delete;

  // See content_store::discard_head (the FUSE layer: a writer joined a passthrough inode).
  void discard_head(std::uint64_t version) { content_.discard_head(version); }

  // Startup: records the content store did not take, then the end of replay.
  bool replay_record(std::span<const std::byte> record);
  void replay_done();

  // Called after a file's cached data or attributes changed outside a request (a commit
  // finished or failed): the FUSE layer invalidates the kernel's cache. Set before serving.
  void set_invalidate_hook(std::function<void(ino_t)> hook) { invalidate_ = std::move(hook); }
  // Called after a name was removed outside a request (ckptctl rm/prune through the control
  // socket): the FUSE layer tells the kernel to drop the dentry (fuse_lowlevel_notify_delete),
  // so the listing changes at once. Set before serving.
  void set_entry_removed_hook(
      std::function<void(ino_t parent, ino_t child, std::string_view name)> hook) {
    entry_removed_ = std::move(hook);
  }

  // Entries: each successful call that returns a stat counts one kernel lookup (see forget).
  struct stat lookup(ino_t parent, std::string_view name);
  void forget(ino_t ino, std::uint64_t n);
  struct stat getattr(ino_t ino);
  // size: truncate; fh: the handle of an ftruncate/fchmod, when the kernel gave one.
  struct stat setattr(ino_t ino, const attr_change& change, std::optional<std::uint64_t> size,
                      std::optional<std::uint64_t> fh);
  std::string readlink(ino_t ino);
  struct stat mknod(ino_t parent, std::string_view name, std::uint32_t mode, std::uint64_t rdev,
                    std::uint32_t uid, std::uint32_t gid);
  struct stat symlink(ino_t parent, std::string_view name, std::string_view target,
                      std::uint32_t uid, std::uint32_t gid);
  struct stat link(ino_t ino, ino_t new_parent, std::string_view new_name);
  void unlink(ino_t parent, std::string_view name);
  void rmdir(ino_t parent, std::string_view name);
  void rename(ino_t parent, std::string_view name, ino_t new_parent, std::string_view new_name,
              unsigned flags);

  // The largest file size (as ext4 with 4 KiB blocks): a write, truncate or fallocate past it
  // fails with EFBIG at once. Holes cost nothing below it (write_buffer, data_runs).
  static constexpr std::uint64_t max_file_size = std::uint64_t(1) << 44;  // 16 TiB
  // st_blksize: the I/O size tools stride by (cp, dd, stress-ng). Not the 1 MiB FUSE request
  // size: tools that extend files by st_blksize steps would then grow them by up to 1 GiB.
  static constexpr std::uint32_t block_size = 128 << 10;

  // Files.
  open_result open(ino_t ino, int flags);
  std::pair<struct stat, open_result> create(ino_t parent, std::string_view name,
                                             std::uint32_t mode, int flags, std::uint32_t uid,
                                             std::uint32_t gid);
  std::size_t read(std::uint64_t fh, std::uint64_t offset, std::span<std::byte> out);
  // Like read(), but when the bytes are already in memory (content_reader::peek) they are handed
  // out in `zero_copy` instead of being copied into `out`; returns the byte count either way.
  std::size_t read(std::uint64_t fh, std::uint64_t offset, std::span<std::byte> out,
                   content_reader::view& zero_copy);
  // kill_priv: the writer lacks CAP_FSETID, so setuid/setgid bits are cleared (as on ext4).
  void write(std::uint64_t fh, std::uint64_t offset, std::span<const std::byte> data,
             bool kill_priv = false);
  // fallocate(2) on a writable handle: mode 0 and FALLOC_FL_KEEP_SIZE check that the store's
  // filesystem has room for the range (ENOSPC) and extend the size (mode 0); nothing is reserved:
  // the store is compressed and holes cost nothing. FALLOC_FL_PUNCH_HOLE (with KEEP_SIZE) and
  // FALLOC_FL_ZERO_RANGE make the range read as zeros. Other modes: EOPNOTSUPP.
  void fallocate(std::uint64_t fh, int mode, std::uint64_t offset, std::uint64_t length);
  // lseek(2) SEEK_DATA / SEEK_HOLE (other whence values are the kernel's): the next data or hole
  // at or after `offset`; ENXIO past the end or when no data follows. Holes are found at the
  // write buffer's chunk granularity (1 MiB) and from a stored file's regions.
  std::uint64_t lseek(std::uint64_t fh, std::uint64_t offset, int whence);
  void flush(std::uint64_t fh);
  void release(std::uint64_t fh);
  void fsync(std::uint64_t fh);

  // Directories: opendir takes a snapshot of the entries; readdir pages through it.
  std::uint64_t opendir(ino_t ino);
  std::vector<dir_entry> readdir(std::uint64_t fh, std::uint64_t offset, std::size_t max);
  // readdirplus: entries with their attributes (waiting for pending files, like lookup). Each
  // returned entry other than "." and ".." counts one lookup; entries that vanished since
  // opendir are skipped (their index is still consumed). The caller forgets the ones it could
  // not send.
  struct dir_entry_plus {
    dir_entry entry;
    std::uint64_t index = 0;  // position in the snapshot (the next offset is index + 1)
    struct stat st {};
    bool counted = false;  // a lookup was counted
  };
  std::vector<dir_entry_plus> readdirplus(std::uint64_t fh, std::uint64_t offset, std::size_t max);
  void releasedir(std::uint64_t fh);
  void fsyncdir();
  struct statvfs statfs();

  // "user.ckptfs.info" is virtual: getxattr answers content_store::info() as JSON for a regular
  // file; it is never listed and cannot be set.
  static constexpr std::string_view info_xattr = "user.ckptfs.info";
  // Setting "user.ckptfs.drop_caches" (any value, on any file of the mount) empties the content
  // store's caches of reconstructed checkpoints and decoded data; nothing is stored.
  static constexpr std::string_view drop_caches_xattr = "user.ckptfs.drop_caches";
  // "user.ckptfs.store" is virtual and read-only: the absolute store directory (ckptctl finds the
  // daemon's control socket, STORE/control.sock, through it). Never listed.
  static constexpr std::string_view store_xattr = "user.ckptfs.store";
  void setxattr(ino_t ino, std::string_view name, std::string_view value, int flags);
  std::string getxattr(ino_t ino, std::string_view name);
  std::vector<std::string> listxattr(ino_t ino);
  void removexattr(ino_t ino, std::string_view name);

  // Finishes queued commits, syncs the journal, stops background threads. Idempotent.
  void shutdown();

  // For tests and tools: the committed version of a file.
  content_ref content_of(ino_t ino);

  // ---- management (fs/admin; filesystem_admin.cpp) ----
  // Paths are relative to the root, '/'-separated ("" or "/" is the root).
  struct named_file {
    std::string path;  // "dir/file.pt"
    ino_t ino = 0;
    content_ref content;  // the committed version
  };
  std::vector<named_file> regular_files();  // every name of every regular file
  ino_t resolve(std::string_view path);     // ENOENT / ENOTDIR
  // Removes the name `path` like unlink, but only if it still names `expected` and its file is
  // not being written (a writer's newer version is never removed by a stale decision). Tells the
  // kernel (entry-removed hook). Returns false if skipped. The record is synced lazily: call sync.
  bool remove_if(std::string_view path, const content_ref& expected);
  // Rewrites a delta version as a keyframe (content_store::rekey) and makes it durable; returns
  // the new object's bytes (0 if nothing was done).
  std::uint64_t rekey(std::uint64_t version);
  // Makes every record durable and releases what waited for it (like fsyncdir).
  void sync() { sync_journal(); }
  // Rewrites the journal as a snapshot now (tests); false when a put is between its records.
  bool compact() { return maybe_compact(true); }

  // What the write path holds right now (`ckptctl status`). Cheap and thread-safe: atomics and
  // the chunk pool's short lock; it never waits for the namespace lock or a commit.
  struct resources {
    std::uint64_t buffer_budget = 0;  // buffer=
    // Write-buffer memory taken from the budget: files being written, files waiting for or in
    // their commit, and head images not yet published (content_store::resources::head_memory).
    std::uint64_t buffer_bytes = 0;
    std::uint64_t spilled_bytes = 0;  // write-buffer chunks in staging files (whole 1 MiB chunks)
    // Freed chunk memory kept for the next buffers (MADV_FREE: the kernel may take it back).
    // buffer_bytes + pooled_bytes never exceeds buffer_budget.
    std::uint64_t pooled_bytes = 0;
    std::uint64_t commits_queued = 0;   // closed files waiting for a commit worker
    std::uint64_t commits_running = 0;  // files being stored now (workers, fsync, truncate)
    // Rotation: hidden chains freed by rewriting the delta above them (since the mount).
    std::uint64_t chain_rewrites = 0, chain_rewrite_bytes = 0, chain_freed_bytes = 0;
    // Deletions not looked at yet (their versions' release waits for the journal's sync, the
    // objects they free for the next), or a rewrite running.
    bool chain_rewrite_pending = false;
  };
  resources usage() const;

 private:
  struct runtime {  // per inode, not persisted
    std::uint64_t nlookup = 0;
    std::uint32_t opens = 0;    // file and directory handles
    std::uint32_t writers = 0;  // writable file handles
    // Writable handles closed at least once (FLUSH) and not written since: when it equals
    // `writers`, the writer has most likely closed the file and its RELEASE is on its way.
    std::uint32_t writers_closed = 0;
    bool release_wait_spent = false;  // a reader waited for that RELEASE in vain (see open)
    // Shared: a commit hands it to the content store, which may keep it as a head image.
    std::shared_ptr<write_buffer> buf;
    bool loaded = false;   // buf holds the file's bytes (else reads go to the committed version)
    bool dirty = false;    // buf differs from the committed version
    bool pending = false;  // a commit (or a synchronous load/commit) is in progress
    // Failed commits (at release or fsync), reported like Linux's errseq_t. error_seq counts
    // them; a handle reports the last errno once, by its next flush or fsync, if error_seq moved
    // past the handle's error_since. So every handle open at a failure reports it: one reader's
    // close does not swallow it for the others. A handle opened later starts at error_claimed,
    // so it reports a failure nobody claimed yet: a background commit runs after the writer's
    // last close, and the writer learns of its failure only through a descriptor it opens
    // afterwards. A failure is claimed by such a later handle reporting it, or by the fsync whose
    // commit failed returning it; reports to handles that were merely open when it happened do
    // not claim it.
    int error = 0;                    // errno of the last failed commit
    std::uint64_t error_seq = 0;      // failed commits so far
    std::uint64_t error_claimed = 0;  // error_seq when a failure was last claimed (see above)
    bool error_unclaimed() const { return error_claimed != error_seq; }
    void commit_failed(int err) {
      error = err;
      ++error_seq;
    }
    bool cache_ok = false;  // the kernel's cached pages match the committed version
    timespec mtime{};       // of the last write into buf
    std::string path;       // last known path (lineage matching)
    // Streaming writes: the content store's stream following stream_buf (the buf it started
    // on). It goes with that buffer's commit; a buffer dropped or replaced without one retires
    // it (retire_stream).
    std::shared_ptr<content_store::stream> stream;
    std::shared_ptr<write_buffer> stream_buf;
  };
  struct handle {
    ino_t ino = 0;
    bool writable = false;
    // Writable, flushed (a close()) and not written since: counted in runtime::writers_closed.
    bool closed = false;
    bool dir = false;
    std::shared_ptr<const content_reader> reader;
    content_ref reader_ref;
    // The head image the open may read by passthrough, held until RELEASE: an image someone
    // holds is never retired (content_store: its blocks released under a reader).
    std::shared_ptr<const content_reader> image;
    std::vector<dir_entry> entries;  // directories
    // Files (see runtime::error): failed commits up to error_since are not reported to this
    // handle; error_opened is the inode's error_seq at open.
    std::uint64_t error_since = 0;
    std::uint64_t error_opened = 0;
  };

  using lock_t = std::unique_lock<std::mutex>;
  void journal_ok() const;                    // throws EIO while the journal is poisoned
  void append(const nlohmann::json& record);  // mu_ held
  struct stat stat_of(ino_t ino);             // mu_ held
  struct stat entry_of(ino_t ino);            // mu_ held; counts a lookup
  runtime& rt(ino_t ino) { return rt_[ino]; }
  void wait_idle(lock_t& lk, ino_t ino);         // waits while the inode is pending
  void wait_for_release(lock_t& lk, ino_t ino);  // a reader after close: see filesystem_files.cpp
  // mu_ held. The file changed (write, fallocate, truncate), through handle `fh` if given: that
  // handle is no longer closing, and a new round of writes may be waited for again.
  void note_modified(runtime& r, std::optional<std::uint64_t> fh);
  void load(lock_t& lk, ino_t ino);              // fills buf from the committed version
  void maybe_drop(ino_t ino);                    // mu_ held: frees an inode nothing uses
  void release_content(const content_ref& ref);  // mu_ held: unref after the next sync
  void apply_unrefs(const std::vector<content_ref>& unrefs) noexcept;        // after a sync
  void remove_unneeded(const std::vector<std::uint64_t>& objects) noexcept;  // after a sync
  std::string path_of(ino_t parent, std::string_view name) const;
  handle& handle_at(std::uint64_t fh);
  // mu_ held. A file handle for `ino`, with its starting point for failed commits.
  std::uint64_t add_file_handle(ino_t ino, bool writable);
  // mu_ held. Throws the errno of a failed commit `fh` has not reported yet (runtime::error).
  void report_commit_error(std::uint64_t fh);
  // Stores `buf` as the inode's new content and syncs; returns 0 or an errno. mu_ not held. The
  // content store may keep `buf` (a head image) and rewrite it in place (buf->modified()).
  // Callers count it in commits_running_ (running_commit) for usage().
  int commit(ino_t ino, const std::shared_ptr<write_buffer>& buf, const std::string& path,
             timespec mtime, std::shared_ptr<content_store::stream> stream = nullptr);
  // mu_ held. Starts a stream over r.buf when it qualifies (fs_config::stream_after).
  void maybe_stream(runtime& r);
  // mu_ held. The stream following `buf`, taken out of r for its commit (null if none).
  static std::shared_ptr<content_store::stream> take_stream(
      runtime& r, const std::shared_ptr<write_buffer>& buf);
  // mu_ held. A stream whose buffer is no longer r.buf is cancelled; its thread is joined on a
  // worker, not under mu_ (it may be waiting for a lineage another put encodes).
  void retire_stream(runtime& r);
  void sync_journal();
  void rejoin_lineages(ino_t ino, const std::string& path);  // mu_ held
  // Writes a snapshot into a new journal when it grew past compact_bytes (or `force`); false if
  // it did not (small enough, or a put is in flight).
  bool maybe_compact(bool force);
  void flusher();
  void rewriter(std::stop_token stop);  // rotation: chain rewrites (filesystem_admin.cpp)
  static timespec now();

  store::journal& journal_;
  content_store& content_;
  fs_config cfg_;
  std::shared_ptr<memory_budget> budget_;
  std::function<void(ino_t)> invalidate_;
  std::function<void(ino_t, ino_t, std::string_view)> entry_removed_;

  std::mutex mu_;                    // namespace, runtime and handles
  std::condition_variable idle_cv_;  // a pending inode became idle
  // Readers waiting in wait_for_release: at most half the FUSE loop's threads, so that the
  // RELEASEs they wait for always find a thread to serve them.
  std::uint32_t release_waiters_ = 0;
  namespace_tree tree_;
  std::unordered_map<ino_t, runtime> rt_;
  std::unordered_map<std::uint64_t, handle> handles_;
  std::uint64_t next_fh_ = 1;
  std::vector<content_ref> unref_after_sync_;
  // Versions released and not yet unref()ed: queued above, or taken by a sync in progress.
  std::atomic<std::size_t> unrefs_waiting_{0};
  std::uint64_t records_since_sync_ = 0;

  std::mutex sync_mu_;          // one journal sync at a time
  std::shared_mutex put_gate_;  // puts (shared) vs compaction (exclusive)
  std::mutex flusher_mu_;
  std::condition_variable flusher_cv_;
  std::atomic<bool> journal_failed_{false};  // a sync failed; not yet rewritten
  // usage(): commits handed to workers_ and not started; commit() calls in progress (each
  // caller of commit() holds a running_commit around it).
  std::atomic<std::uint64_t> commits_queued_{0}, commits_running_{0};
  struct running_commit {
    std::atomic<std::uint64_t>& n;
    explicit running_commit(std::atomic<std::uint64_t>& count) : n(count) { n.fetch_add(1); }
    ~running_commit() { n.fetch_sub(1); }
    running_commit(const running_commit&) = delete;
    running_commit& operator=(const running_commit&) = delete;
  };
  bool stopping_ = false;
  bool shut_down_ = false;
  std::unique_ptr<worker_pool> workers_;
  std::jthread flusher_;
  std::atomic<std::uint64_t> chain_rewrites_{0}, chain_rewrite_bytes_{0}, chain_freed_bytes_{0};
  std::atomic<bool> chain_rewriting_{false};
  std::mutex rewriter_mu_;
  std::condition_variable_any rewriter_cv_;
  std::jthread rewriter_;  // after flusher_: stopped and joined first
};

}  // namespace ckpt::fs
