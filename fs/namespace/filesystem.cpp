// fs::filesystem, part 1: construction, replay, shared helpers, the journal (lazy syncs,
// deferred releases, compaction, recovery) and shutdown. Names: filesystem_names.cpp; file data
// and commits: filesystem_files.cpp.
#include "fs/namespace/filesystem.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "codec/error.hpp"
#include "fs/namespace/fail.hpp"
#include "fs/namespace/log.hpp"

namespace ckpt::fs {

timespec filesystem::now() {
  timespec t{};
  timespec_get(&t, TIME_UTC);
  return t;
}

filesystem::filesystem(store::journal& journal, content_store& content, fs_config cfg)
    : journal_(journal),
      content_(content),
      cfg_(std::move(cfg)),
      budget_(std::make_shared<memory_budget>(cfg_.buffer_bytes)) {
  rt_[root_ino].nlookup = 1;  // the kernel never looks the root up, nor forgets it
  workers_ = std::make_unique<worker_pool>(std::max(1u, cfg_.commit_threads));
  flusher_ = std::jthread([this] { flusher(); });
  if (cfg_.rewrite_factor > 0)
    rewriter_ = std::jthread([this](std::stop_token stop) { rewriter(stop); });
}

filesystem::resources filesystem::usage() const {
  resources r;
  r.buffer_budget = budget_->limit();
  r.buffer_bytes = budget_->used();
  r.spilled_bytes = budget_->spilled();
  r.pooled_bytes = std::uint64_t(budget_->pooled_chunks()) * chunk_memory::bytes;
  r.commits_queued = commits_queued_.load();
  r.commits_running = commits_running_.load();
  r.chain_rewrites = chain_rewrites_.load();
  r.chain_rewrite_bytes = chain_rewrite_bytes_.load();
  r.chain_freed_bytes = chain_freed_bytes_.load();
  // Deletions waiting for the journal's sync before the store lets their versions go, and
  // objects they freed waiting for the next one, count as not looked at yet: until both are
  // done the store's bytes still change without anything written.
  r.chain_rewrite_pending = chain_rewriting_.load() || unrefs_waiting_.load() != 0 ||
                            content_.has_unneeded_objects() ||
                            (cfg_.rewrite_factor > 0 && content_.has_chain_hints());
  return r;
}

filesystem::~filesystem() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    log_error(std::string("shutdown: ") + e.what());
  }
}

// ---- replay ----

bool filesystem::replay_record(std::span<const std::byte> record) {
  auto j = nlohmann::json::from_cbor(
      reinterpret_cast<const std::uint8_t*>(record.data()),
      reinterpret_cast<const std::uint8_t*>(record.data()) + record.size(), true, false);
  if (j.is_discarded()) throw corrupt_error("journal: a record is not CBOR");
  std::lock_guard lk(mu_);
  return tree_.replay(j);
}

void filesystem::replay_done() {
  std::vector<content_ref> live;
  {
    std::lock_guard lk(mu_);
    live = tree_.replay_done();
    if (tree_.records_replayed() == 0) {  // a new filesystem: its root was made now
      timespec t = now();
      attr_change c;
      c.atime = c.mtime = t;
      append(tree_.set_attr(root_ino, c, t));
    }
  }
  content_.replay_done(live);
}

// ---- helpers (mu_ held unless stated) ----

void filesystem::journal_ok() const {
  // A mutation applies to the tree before its record is appended: refuse it up front rather than
  // change the namespace with a record the journal would drop.
  if (journal_failed_) fail(EIO, "the journal failed to sync; changes resume once it is rewritten");
}

void filesystem::append(const nlohmann::json& record) {
  auto bytes = nlohmann::json::to_cbor(record);
  journal_.append(std::as_bytes(std::span(bytes)));
  if (++records_since_sync_ >= cfg_.sync_every) flusher_cv_.notify_one();
}

struct stat filesystem::stat_of(ino_t ino) {
  const inode& n = tree_.get(ino);
  struct stat st {};
  st.st_ino = ino;
  st.st_mode = n.mode;
  st.st_nlink = n.nlink;
  st.st_uid = n.uid;
  st.st_gid = n.gid;
  st.st_rdev = n.rdev;
  st.st_size = off_t(n.size());
  st.st_atim = n.atime;
  st.st_mtim = n.mtime;
  st.st_ctim = n.ctime;
  auto it = rt_.find(ino);
  if (it != rt_.end() && it->second.buf && it->second.loaded) {
    st.st_size = off_t(it->second.buf->size());
    if (it->second.dirty) st.st_mtim = st.st_ctim = it->second.mtime;
  }
  st.st_blksize = block_size;
  // What the file takes: its object on disk once stored (compressed, holes free), the chunks
  // that hold data while it is being written.
  std::uint64_t taken = content_.stored_bytes(n.content);
  if (it != rt_.end() && it->second.buf && it->second.loaded)
    taken = it->second.buf->allocated_bytes();
  st.st_blocks = blkcnt_t((taken + 511) / 512);
  return st;
}

struct stat filesystem::entry_of(ino_t ino) {
  struct stat st = stat_of(ino);
  ++rt(ino).nlookup;
  return st;
}

void filesystem::wait_idle(lock_t& lk, ino_t ino) {
  idle_cv_.wait(lk, [&] {
    auto it = rt_.find(ino);
    return it == rt_.end() || !it->second.pending;
  });
}

void filesystem::load(lock_t& lk, ino_t ino) {
  runtime& r = rt(ino);
  if (r.loaded) return;
  if (!r.buf) r.buf = std::make_shared<write_buffer>(budget_, cfg_.staging_dir);
  content_ref ref = tree_.get(ino).content;
  if (ref.size != 0) {
    // Opening the version reads its metadata: mark the inode busy and do it without the lock.
    r.pending = true;
    lk.unlock();
    int err = 0;
    std::string what;
    auto fresh = std::make_shared<write_buffer>(budget_, cfg_.staging_dir);
    try {
      // Copy-on-write over the stored version: nothing is decoded until it is read or written
      // around, and an exact file's unchanged blocks are reused by its next version.
      fresh->set_base(content_.open(ref), ref.version, content_.data_runs(ref));
    } catch (const std::exception& e) {
      err = errno_of(e);
      what = e.what();
    }
    lk.lock();
    runtime& r2 = rt(ino);
    r2.pending = false;
    idle_cv_.notify_all();
    if (err) {
      log_error("loading inode " + std::to_string(ino) + " for writing: " + what);
      fail(err, what);
    }
    // Writes that raced in (none: writers wait while pending) cannot exist; take the bytes.
    r2.buf = std::move(fresh);
  }
  rt(ino).loaded = true;
}

void filesystem::release_content(const content_ref& ref) {
  if (ref.version == 0) return;
  unref_after_sync_.push_back(ref);
  unrefs_waiting_.fetch_add(1);
}

void filesystem::apply_unrefs(const std::vector<content_ref>& unrefs) noexcept {
  for (const auto& r : unrefs) {
    try {
      content_.unref(r);
    } catch (const std::exception& e) {
      log_error("releasing version " + std::to_string(r.version) + ": " + e.what());
    }
    unrefs_waiting_.fetch_sub(1);
  }
}

void filesystem::maybe_drop(ino_t ino) {
  if (ino == root_ino) return;
  const inode* n = tree_.find(ino);
  if (!n || n->nlink != 0) return;
  auto it = rt_.find(ino);
  if (it != rt_.end()) {
    const runtime& r = it->second;
    // Unlinked while it is being written: it will not be stored, so its stream stops now (the
    // stream object goes with the buffer at the last close).
    if (r.stream) r.stream_buf->cancel_stream();
    if (r.opens || r.pending) return;
    if (r.nlookup) {
      // Still known to the kernel but unreachable: its write buffer can go now. Its content
      // stays until the kernel's FORGET: an O_PATH descriptor can still reopen the file through
      // /proc/self/fd, and must read what it did.
      it->second.buf.reset();
      retire_stream(it->second);
      return;
    }
    it->second.buf.reset();
    retire_stream(it->second);
  }
  if (n->is_reg()) release_content(n->content);
  tree_.erase(ino);
  if (it != rt_.end()) rt_.erase(it);
}

std::string filesystem::path_of(ino_t parent, std::string_view name) const {
  std::vector<std::string> parts{std::string(name)};
  for (ino_t cur = parent; cur != root_ino;) {
    const inode* d = tree_.find(cur);
    if (!d) break;
    const inode* p = tree_.find(d->parent);
    if (!p) break;
    for (const auto& [n, c] : p->entries)
      if (c == cur) {
        parts.push_back(n);
        break;
      }
    cur = d->parent;
  }
  std::string out;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) out += "/" + *it;
  return out;
}

filesystem::handle& filesystem::handle_at(std::uint64_t fh) {
  auto it = handles_.find(fh);
  if (it == handles_.end()) fail(EBADF, "unknown file handle");
  return it->second;
}

// ---- journal ----

void filesystem::sync_journal() {
  std::lock_guard s(sync_mu_);
  std::vector<content_ref> unrefs;
  {
    std::lock_guard lk(mu_);
    unrefs.swap(unref_after_sync_);
    records_since_sync_ = 0;
  }
  // Taken before the sync: their records were appended before it, so it makes them durable.
  const auto unneeded = content_.take_unneeded_objects();
  try {
    journal_.sync();
  } catch (...) {
    journal_failed_ = true;   // the flusher rewrites the journal from memory
    std::lock_guard lk(mu_);  // keep them: never release data whose unnaming is not durable
    unref_after_sync_.insert(unref_after_sync_.end(), unrefs.begin(), unrefs.end());
    content_.return_unneeded_objects(unneeded);  // the rewrite's sync removes them
    throw;
  }
  remove_unneeded(unneeded);
  apply_unrefs(unrefs);
}

void filesystem::remove_unneeded(const std::vector<std::uint64_t>& objects) noexcept {
  try {
    content_.remove_objects(objects);
  } catch (const std::exception& e) {
    // Left on disk, named by no record: garbage `ckptctl gc` removes. The unrefs that follow
    // must run whatever happened here (their records are durable).
    log_error(std::string("removing unneeded objects: ") + e.what());
  }
}

bool filesystem::maybe_compact(bool force) {
  if (!force && journal_.size_bytes() < cfg_.compact_bytes) return false;
  std::unique_lock gate(put_gate_, std::try_to_lock);  // never while a put is between records
  if (!gate.owns_lock()) return false;
  std::lock_guard s(sync_mu_);
  // The snapshot and the journal's cut are taken together under the namespace lock; the new
  // file is written and fsynced without it, so requests are not held up by the disk. Records
  // appended meanwhile follow the snapshot in the new file and wait for the next sync, like
  // the unrefs that come with them.
  std::vector<content_ref> unrefs;
  std::vector<std::vector<std::byte>> records;
  store::journal::compaction cut;
  std::uint64_t before;
  decltype(content_.take_unneeded_objects()) unneeded;
  {
    std::lock_guard lk(mu_);
    unneeded = content_.take_unneeded_objects();
    content_.snapshot(records);
    std::vector<nlohmann::json> ns;
    tree_.snapshot(ns);
    for (const auto& j : ns) {
      auto b = nlohmann::json::to_cbor(j);
      auto bytes = std::as_bytes(std::span(b));
      records.emplace_back(bytes.begin(), bytes.end());
    }
    before = journal_.size_bytes();
    cut = journal_.begin_compact();
    unrefs.swap(unref_after_sync_);
    records_since_sync_ = 0;
  }
  gate.unlock();  // puts may append again: their records go after the cut
  try {
    journal_.finish_compact(std::move(cut), records);
  } catch (...) {
    std::lock_guard lk(mu_);  // not durable: keep them for a later sync or compaction
    unref_after_sync_.insert(unref_after_sync_.begin(), unrefs.begin(), unrefs.end());
    content_.return_unneeded_objects(unneeded);
    records_since_sync_ += 1;  // the records before the cut are not durable: sync them
    throw;
  }
  remove_unneeded(unneeded);
  apply_unrefs(unrefs);
  log_info("journal compacted: " + std::to_string(before) + " -> " +
           std::to_string(journal_.size_bytes()) + " bytes");
  return true;
}

void filesystem::flusher() {
  std::unique_lock lk(flusher_mu_);
  while (!stopping_) {
    flusher_cv_.wait_for(lk, cfg_.sync_interval);
    if (stopping_) break;
    lk.unlock();
    try {
      bool dirty;
      {
        std::lock_guard g(mu_);
        dirty = records_since_sync_ != 0 || !unref_after_sync_.empty() ||
                content_.has_unneeded_objects();
      }
      if (journal_failed_) {
        // A failed sync poisons the journal; a snapshot of the state in memory, written to a
        // new file, makes it usable again (retried every interval while it fails).
        if (maybe_compact(true)) {
          journal_failed_ = false;
          log_info("journal rewritten from memory after a failed sync");
        }
      } else {
        if (dirty) sync_journal();
        maybe_compact(false);
      }
    } catch (const std::exception& e) {
      log_error(std::string("journal: ") + e.what());
    }
    lk.lock();
  }
}

void filesystem::shutdown() {
  {
    std::lock_guard lk(flusher_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  // A chain rewrite in progress finishes (it is a complete version or nothing); no new one.
  if (rewriter_.joinable()) {
    rewriter_.request_stop();
    rewriter_.join();
  }
  workers_->drain();
  // Files still open for writing when the mount went away (the kernel drops queued releases on
  // unmount): store what they hold, like a release would have.
  std::vector<ino_t> dirty;
  {
    std::lock_guard lk(mu_);
    for (const auto& [ino, r] : rt_) {
      const inode* n = tree_.find(ino);
      if (r.buf && r.loaded && r.dirty && !r.pending && n && n->nlink > 0) dirty.push_back(ino);
    }
  }
  for (ino_t ino : dirty) {
    std::shared_ptr<content_store::stream> stream;
    std::shared_ptr<write_buffer> buf;
    std::string path;
    timespec mtime{};
    {
      std::lock_guard lk(mu_);
      runtime& r = rt(ino);
      stream = take_stream(r, r.buf);
      buf = std::move(r.buf);
      r.loaded = r.dirty = false;
      path = r.path;
      mtime = r.mtime;
    }
    const running_commit running(commits_running_);
    if (int err = commit(ino, buf, path, mtime, std::move(stream)))
      log_error("at unmount, " + path + " could not be stored: " + std::strerror(err));
    else
      log_info("at unmount, stored " + path + " (still open for writing)");
  }
  // Streams of files that were not stored (open, nothing written since their last commit):
  // cancelled and joined before the content store goes.
  std::vector<std::shared_ptr<content_store::stream>> streams;
  {
    std::lock_guard lk(mu_);
    for (auto& [ino, r] : rt_) {
      if (!r.stream) continue;
      r.stream_buf->cancel_stream();
      r.stream_buf.reset();
      streams.push_back(std::move(r.stream));
    }
  }
  streams.clear();
  {
    std::lock_guard lk(flusher_mu_);
    stopping_ = true;
  }
  flusher_cv_.notify_all();
  if (flusher_.joinable()) flusher_.join();
  workers_.reset();
  sync_journal();
  // The newest checkpoints' head images go to disk before the daemon exits, so that the first
  // load after the next mount does not decode their chains.
  content_.wait_heads();
}

}  // namespace ckpt::fs
