#include "fs/namespace/filesystem.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "codec/error.hpp"
#include "fs/namespace/log.hpp"

namespace ckpt::fs {
namespace {

[[noreturn]] void fail(int err, const std::string& what) {
  throw io_error(err, what);
}

// The errno a failed commit reports, and a log line for it.
int errno_of(const std::exception& e) {
  if (auto* io = dynamic_cast<const io_error*>(&e)) return io->sys_errno() ? io->sys_errno() : EIO;
  if (dynamic_cast<const std::bad_alloc*>(&e)) return ENOMEM;
  if (auto* se = dynamic_cast<const std::system_error*>(&e)) return se->code().value();
  return EIO;
}

}  // namespace

timespec filesystem::now() {
  timespec t{};
  timespec_get(&t, TIME_UTC);
  return t;
}

filesystem::filesystem(store::journal& journal, content_store& content, fs_config cfg)
    : journal_(journal), content_(content), cfg_(std::move(cfg)), budget_(cfg_.buffer_bytes) {
  rt_[root_ino].nlookup = 1;  // the kernel never looks the root up, nor forgets it
  workers_ = std::make_unique<worker_pool>(std::max(1u, cfg_.commit_threads));
  flusher_ = std::jthread([this] { flusher(); });
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
  st.st_blksize = 1 << 20;
  st.st_blocks = (st.st_size + 511) / 512;
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
  if (!r.buf) r.buf = std::make_unique<write_buffer>(budget_, cfg_.staging_dir);
  content_ref ref = tree_.get(ino).content;
  if (ref.size != 0) {
    // Decoding may take a while: mark the inode busy and do it without the lock.
    r.pending = true;
    lk.unlock();
    int err = 0;
    std::string what;
    auto fresh = std::make_unique<write_buffer>(budget_, cfg_.staging_dir);
    try {
      auto reader = content_.open(ref);
      std::vector<std::byte> chunk(write_buffer::chunk_bytes);
      for (std::uint64_t off = 0; off < ref.size;) {
        std::size_t n = reader->read(off, chunk);
        if (n == 0) throw corrupt_error("stored version shorter than its size");
        fresh->write(off, std::span(chunk).first(n));
        off += n;
      }
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
  if (ref.version != 0) unref_after_sync_.push_back(ref);
}

void filesystem::maybe_drop(ino_t ino) {
  if (ino == root_ino) return;
  const inode* n = tree_.find(ino);
  if (!n || n->nlink != 0) return;
  auto it = rt_.find(ino);
  if (it != rt_.end()) {
    const runtime& r = it->second;
    if (r.opens || r.pending) return;
    if (r.nlookup) {
      // Still known to the kernel but unreachable: its data can go now.
      it->second.buf.reset();
      return;
    }
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
  try {
    journal_.sync();
  } catch (...) {
    journal_failed_ = true;   // the flusher rewrites the journal from memory
    std::lock_guard lk(mu_);  // keep them: never release data whose unnaming is not durable
    unref_after_sync_.insert(unref_after_sync_.end(), unrefs.begin(), unrefs.end());
    throw;
  }
  for (const auto& r : unrefs) {
    try {
      content_.unref(r);
    } catch (const std::exception& e) {
      log_error("releasing version " + std::to_string(r.version) + ": " + e.what());
    }
  }
}

bool filesystem::maybe_compact(bool force) {
  if (!force && journal_.size_bytes() < cfg_.compact_bytes) return false;
  std::unique_lock gate(put_gate_, std::try_to_lock);  // never while a put is between records
  if (!gate.owns_lock()) return false;
  std::lock_guard s(sync_mu_);
  std::vector<content_ref> unrefs;
  {
    std::lock_guard lk(mu_);
    std::vector<std::vector<std::byte>> records;
    content_.snapshot(records);
    std::vector<nlohmann::json> ns;
    tree_.snapshot(ns);
    for (const auto& j : ns) {
      auto b = nlohmann::json::to_cbor(j);
      auto bytes = std::as_bytes(std::span(b));
      records.emplace_back(bytes.begin(), bytes.end());
    }
    std::uint64_t before = journal_.size_bytes();
    journal_.compact(records);
    log_info("journal compacted: " + std::to_string(before) + " -> " +
             std::to_string(journal_.size_bytes()) + " bytes");
    unrefs.swap(unref_after_sync_);
    records_since_sync_ = 0;
  }
  for (const auto& r : unrefs) content_.unref(r);
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
        dirty = records_since_sync_ != 0 || !unref_after_sync_.empty();
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
    std::unique_ptr<write_buffer> buf;
    std::string path;
    timespec mtime{};
    {
      std::lock_guard lk(mu_);
      runtime& r = rt(ino);
      buf = std::move(r.buf);
      r.loaded = r.dirty = false;
      path = r.path;
      mtime = r.mtime;
    }
    if (int err = commit(ino, *buf, path, mtime))
      log_error("at unmount, " + path + " could not be stored: " + std::strerror(err));
    else
      log_info("at unmount, stored " + path + " (still open for writing)");
  }
  {
    std::lock_guard lk(flusher_mu_);
    stopping_ = true;
  }
  flusher_cv_.notify_all();
  if (flusher_.joinable()) flusher_.join();
  workers_.reset();
  sync_journal();
}

// ---- entries ----

struct stat filesystem::lookup(ino_t parent, std::string_view name) {
  lock_t lk(mu_);
  if (name.size() > 255) fail(ENAMETOOLONG, "name too long");
  ino_t c = tree_.child(parent, name);
  if (!c) fail(ENOENT, "no such entry");
  wait_idle(lk, c);
  if (!tree_.find(c)) fail(ENOENT, "no such entry");
  rt(c).path = path_of(parent, name);
  return entry_of(c);
}

void filesystem::forget(ino_t ino, std::uint64_t n) {
  std::lock_guard lk(mu_);
  auto it = rt_.find(ino);
  if (it == rt_.end() || ino == root_ino) return;
  it->second.nlookup -= std::min(n, it->second.nlookup);
  if (it->second.nlookup == 0) {
    maybe_drop(ino);
    // Runtime state of a named, idle, forgotten inode is not needed any more.
    auto again = rt_.find(ino);
    if (again != rt_.end() && !again->second.opens && !again->second.pending &&
        !again->second.buf && !again->second.error && !again->second.nlookup)
      rt_.erase(again);
  }
}

struct stat filesystem::getattr(ino_t ino) {
  lock_t lk(mu_);
  wait_idle(lk, ino);
  return stat_of(ino);
}

struct stat filesystem::setattr(ino_t ino, const attr_change& change,
                                std::optional<std::uint64_t> size,
                                std::optional<std::uint64_t> fh) {
  lock_t lk(mu_);
  wait_idle(lk, ino);
  const inode& n = tree_.get(ino);
  if (size) {
    if (n.is_dir()) fail(EISDIR, "truncate of a directory");
    if (!n.is_reg()) fail(EINVAL, "truncate of a special file");
    (void)fh;
    runtime& r = rt(ino);
    if (r.buf && r.writers) {
      // Open for writing: truncate the buffer; the commit at release stores it.
      if (!r.loaded && *size != 0) load(lk, ino);
      runtime& r2 = rt(ino);
      if (!r2.loaded) {
        r2.buf->truncate(0);
        r2.loaded = true;
      }
      r2.buf->truncate(*size);
      r2.dirty = true;
      r2.mtime = now();
    } else if (*size != n.content.size) {
      content_ref old = n.content;
      if (*size == 0) {
        timespec t = now();
        journal_ok();
        append(tree_.set_content(ino, content_ref{}, t, t));
        release_content(old);
        r.cache_ok = false;
      } else {
        // Not open for writing: load, truncate and commit now.
        load(lk, ino);
        runtime& r2 = rt(ino);
        r2.buf->truncate(*size);
        r2.pending = true;
        std::string path = r2.path;
        lk.unlock();
        int err = commit(ino, *r2.buf, path, now());
        lk.lock();
        runtime& r3 = rt(ino);
        r3.pending = false;
        r3.buf.reset();
        r3.loaded = false;
        idle_cv_.notify_all();
        if (err) fail(err, "truncate: storing the file failed");
      }
    }
  }
  if (change.mode || change.uid || change.gid || change.atime || change.mtime || size) {
    attr_change c = change;
    runtime& r = rt(ino);
    timespec t = now();
    // Like ext4, a truncate marks the file modified even when the size does not change.
    if (size && !change.mtime) c.mtime = t;
    journal_ok();
    append(tree_.set_attr(ino, c, t));
    if (c.mtime && r.buf && r.loaded) r.mtime = *c.mtime;
  }
  return stat_of(ino);
}

std::string filesystem::readlink(ino_t ino) {
  std::lock_guard lk(mu_);
  const inode& n = tree_.get(ino);
  if (!n.is_lnk()) fail(EINVAL, "not a symbolic link");
  return n.target;
}

struct stat filesystem::mknod(ino_t parent, std::string_view name, std::uint32_t mode,
                              std::uint64_t rdev, std::uint32_t uid, std::uint32_t gid) {
  std::lock_guard lk(mu_);
  std::uint32_t type = mode & S_IFMT;
  if (type == 0)
    mode |= S_IFREG;
  else if (type != S_IFREG && type != S_IFDIR && type != S_IFIFO && type != S_IFSOCK &&
           type != S_IFCHR && type != S_IFBLK)
    fail(EINVAL, "unsupported file type");
  const inode& p = tree_.get(parent);
  if (p.mode & S_ISGID) {  // BSD group semantics of a setgid directory
    gid = p.gid;
    if (S_ISDIR(mode)) mode |= S_ISGID;
  }
  journal_ok();
  auto rec = tree_.make_node(parent, name, mode, rdev, uid, gid, {}, now());
  append(rec);
  ino_t ino = rec.at("i");
  rt(ino).path = path_of(parent, name);
  return entry_of(ino);
}

struct stat filesystem::symlink(ino_t parent, std::string_view name, std::string_view target,
                                std::uint32_t uid, std::uint32_t gid) {
  std::lock_guard lk(mu_);
  if (target.empty() || target.size() >= 4096) fail(ENAMETOOLONG, "bad symlink target");
  journal_ok();
  auto rec = tree_.make_node(parent, name, S_IFLNK | 0777, 0, uid, gid, target, now());
  append(rec);
  return entry_of(rec.at("i"));
}

struct stat filesystem::link(ino_t ino, ino_t new_parent, std::string_view new_name) {
  std::lock_guard lk(mu_);
  journal_ok();
  append(tree_.link(ino, new_parent, new_name, now()));
  return entry_of(ino);
}

void filesystem::unlink(ino_t parent, std::string_view name) {
  std::lock_guard lk(mu_);
  ino_t c = tree_.child(parent, name);
  journal_ok();
  append(tree_.remove(parent, name, false, now()));
  maybe_drop(c);
}

void filesystem::rmdir(ino_t parent, std::string_view name) {
  std::lock_guard lk(mu_);
  ino_t c = tree_.child(parent, name);
  journal_ok();
  append(tree_.remove(parent, name, true, now()));
  maybe_drop(c);
}

void filesystem::rename(ino_t parent, std::string_view name, ino_t new_parent,
                        std::string_view new_name, unsigned flags) {
  std::lock_guard lk(mu_);
  ino_t src = tree_.child(parent, name);
  ino_t dst = tree_.child(new_parent, new_name);
  journal_ok();
  append(tree_.rename(parent, name, new_parent, new_name, flags, now()));
  if (dst && dst != src) maybe_drop(dst);
  if (src && rt_.count(src)) rt_[src].path = path_of(new_parent, new_name);
}

// ---- files ----

open_result filesystem::open(ino_t ino, int flags) {
  lock_t lk(mu_);
  wait_idle(lk, ino);
  const inode& n = tree_.get(ino);
  if (n.is_dir()) fail(EISDIR, "open of a directory");
  if (!n.is_reg()) fail(ENXIO, "special files are not served");
  bool writable = (flags & O_ACCMODE) != O_RDONLY;
  runtime& r = rt(ino);
  open_result res;
  if (writable) {
    if (!r.buf) {
      r.buf = std::make_unique<write_buffer>(budget_, cfg_.staging_dir);
      r.loaded = n.content.size == 0;
    }
    if (flags & O_TRUNC) {
      if (r.loaded ? r.buf->size() != 0 : n.content.size != 0) r.dirty = true;
      r.buf->truncate(0);
      r.loaded = true;
      r.mtime = now();
    }
    ++r.writers;
    res.direct_io = true;
  } else {
    res.keep_cache = r.cache_ok && !r.buf;
    if (!r.buf) r.cache_ok = true;
  }
  ++r.opens;
  res.fh = next_fh_++;
  handles_[res.fh] = handle{ino, writable, false, nullptr, {}, {}};
  return res;
}

std::pair<struct stat, open_result> filesystem::create(ino_t parent, std::string_view name,
                                                       std::uint32_t mode, int flags,
                                                       std::uint32_t uid, std::uint32_t gid) {
  lock_t lk(mu_);
  const inode& p = tree_.get(parent);
  if (p.mode & S_ISGID) gid = p.gid;
  journal_ok();
  auto rec = tree_.make_node(parent, name, S_IFREG | (mode & 07777), 0, uid, gid, {}, now());
  append(rec);
  ino_t ino = rec.at("i");
  runtime& r = rt(ino);
  r.path = path_of(parent, name);
  r.buf = std::make_unique<write_buffer>(budget_, cfg_.staging_dir);
  r.loaded = true;
  bool writable = (flags & O_ACCMODE) != O_RDONLY;
  if (writable) ++r.writers;
  ++r.opens;
  open_result res;
  res.direct_io = writable;
  res.fh = next_fh_++;
  handles_[res.fh] = handle{ino, writable, false, nullptr, {}, {}};
  return {entry_of(ino), res};
}

std::size_t filesystem::read(std::uint64_t fh, std::uint64_t offset, std::span<std::byte> out) {
  std::shared_ptr<const content_reader> reader;
  content_ref ref;
  {
    lock_t lk(mu_);
    ino_t ino = handle_at(fh).ino;
    wait_idle(lk, ino);
    runtime& r = rt(ino);
    if (r.buf && r.loaded) return r.buf->read(offset, out);
    ref = tree_.get(ino).content;
    if (ref.size == 0) return 0;
    handle& h = handle_at(fh);
    if (h.reader_ref != ref) {
      // The handle pins the version it reads (a rewrite of the file in place must not remove
      // data under a read in flight); the previous pin goes after the next journal sync.
      content_.ref(ref);
      release_content(h.reader_ref);
      h.reader_ref = ref;
      h.reader.reset();
    }
    reader = h.reader;
  }
  if (!reader) {
    // Opening a version reads its metadata: not under the lock.
    reader = content_.open(ref);
    std::lock_guard lk(mu_);
    auto it = handles_.find(fh);
    if (it != handles_.end() && it->second.reader_ref == ref) it->second.reader = reader;
  }
  if (offset >= reader->size()) return 0;
  return reader->read(offset, out);
}

void filesystem::write(std::uint64_t fh, std::uint64_t offset, std::span<const std::byte> data,
                       bool kill_priv) {
  lock_t lk(mu_);
  ino_t ino = handle_at(fh).ino;
  if (!handle_at(fh).writable) fail(EBADF, "handle not open for writing");
  wait_idle(lk, ino);
  load(lk, ino);
  runtime& r = rt(ino);
  r.buf->write(offset, data);
  r.dirty = true;
  r.mtime = now();
  if (kill_priv) {
    // A write by an unprivileged writer drops setuid, and setgid of a group-executable file.
    std::uint32_t mode = tree_.get(ino).mode;
    std::uint32_t drop = S_ISUID | ((mode & S_IXGRP) ? S_ISGID : 0);
    if (mode & drop) {
      attr_change c;
      c.mode = mode & ~drop & 07777;
      journal_ok();
      append(tree_.set_attr(ino, c, r.mtime));
    }
  }
}

void filesystem::flush(std::uint64_t fh) {
  std::lock_guard lk(mu_);
  runtime& r = rt(handle_at(fh).ino);
  if (int err = std::exchange(r.error, 0)) fail(err, "an earlier commit of this file failed");
}

int filesystem::commit(ino_t ino, const write_buffer& buf, const std::string& path,
                       timespec mtime) {
  content_ref fresh;
  bool named = false;  // the inode points at `fresh`
  const auto start = std::chrono::steady_clock::now();
  try {
    std::shared_lock gate(put_gate_);
    if (buf.size() != 0) fresh = content_.put(path, buf.source());
    std::lock_guard lk(mu_);
    const inode* n = tree_.find(ino);
    if (!n || n->nlink == 0) {
      release_content(fresh);  // unlinked meanwhile: nobody can see this version
    } else {
      content_ref old = n->content;
      journal_ok();
      auto rec = tree_.set_content(ino, fresh, mtime, now());
      named = true;
      release_content(old);
      append(rec);
    }
  } catch (const std::exception& e) {
    int err = errno_of(e);
    if (!named) {  // stored but never named: give the version back
      std::lock_guard lk(mu_);
      release_content(fresh);
    }
    log_error("storing " + path + " (" + std::to_string(buf.size()) +
              " bytes) failed, the file keeps its previous content: " + e.what());
    return err;
  }
  try {
    sync_journal();
  } catch (const std::exception& e) {
    log_error("journal sync after storing " + path + ": " + e.what());
    return errno_of(e);
  }
  if (buf.size() >= (std::uint64_t(16) << 20)) {  // big files only: one line per checkpoint
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    char line[96];
    std::snprintf(line, sizeof line, " (%.1f MiB) in %.2f s, version %llu",
                  double(buf.size()) / (1 << 20), secs, (unsigned long long)fresh.version);
    log_info("stored " + path + line);
  }
  return 0;
}

void filesystem::release(std::uint64_t fh) {
  lock_t lk(mu_);
  wait_idle(lk, handle_at(fh).ino);  // a synchronous commit may be reading the buffer
  handle h = std::move(handle_at(fh));
  handles_.erase(fh);
  release_content(h.reader_ref);  // the handle's pin (see read)
  ino_t ino = h.ino;
  runtime& r = rt(ino);
  --r.opens;
  if (h.writable && --r.writers == 0) {
    const inode* n = tree_.find(ino);
    if (r.dirty && r.loaded && n && n->nlink > 0) {
      // Hand the buffer to a worker: close() does not wait for encoding.
      r.pending = true;
      r.dirty = false;
      r.loaded = false;
      r.cache_ok = false;
      auto buf = std::shared_ptr<write_buffer>(std::move(r.buf));
      workers_->submit([this, ino, buf, path = r.path, mtime = r.mtime] {
        bool linked;
        {
          std::lock_guard g(mu_);
          const inode* n = tree_.find(ino);
          linked = n && n->nlink > 0;
        }
        // Deleted while queued (rmtree of a fresh checkpoint): nothing to store.
        int err = linked ? commit(ino, *buf, path, mtime) : 0;
        {
          std::lock_guard g(mu_);
          auto it = rt_.find(ino);
          if (it != rt_.end()) {
            it->second.pending = false;
            if (err) it->second.error = err;
          }
          maybe_drop(ino);
        }
        idle_cv_.notify_all();
        if (invalidate_) invalidate_(ino);
      });
      return;
    }
    if (n && n->nlink > 0) {
      r.buf.reset();
      r.loaded = false;
      r.dirty = false;
    }
  }
  if (r.opens == 0 && r.buf && (!tree_.find(ino) || tree_.find(ino)->nlink == 0)) r.buf.reset();
  maybe_drop(ino);
}

void filesystem::fsync(std::uint64_t fh) {
  lock_t lk(mu_);
  ino_t ino = handle_at(fh).ino;
  wait_idle(lk, ino);
  runtime& r = rt(ino);
  if (r.buf && r.loaded && r.dirty) {
    const inode* n = tree_.find(ino);
    if (n && n->nlink > 0) {
      // Commit now; afterwards the handle continues over the committed version.
      r.pending = true;
      r.dirty = false;
      std::string path = r.path;
      timespec mtime = r.mtime;
      write_buffer* buf = r.buf.get();
      lk.unlock();
      int err = commit(ino, *buf, path, mtime);
      lk.lock();
      runtime& r2 = rt(ino);
      r2.pending = false;
      r2.cache_ok = false;
      if (err) {
        r2.dirty = true;  // still ours to store at release
      } else {
        r2.buf = std::make_unique<write_buffer>(budget_, cfg_.staging_dir);
        r2.loaded = tree_.get(ino).content.size == 0;
      }
      idle_cv_.notify_all();
      if (err) fail(err, "fsync: storing the file failed");
      return;
    }
  }
  if (int err = std::exchange(r.error, 0)) fail(err, "an earlier commit of this file failed");
  lk.unlock();
  sync_journal();
}

// ---- directories ----

std::uint64_t filesystem::opendir(ino_t ino) {
  std::lock_guard lk(mu_);
  const inode& n = tree_.get(ino);
  if (!n.is_dir()) fail(ENOTDIR, "not a directory");
  handle h;
  h.ino = ino;
  h.dir = true;
  h.entries.push_back({".", ino, n.mode});
  h.entries.push_back({"..", n.parent, S_IFDIR});
  for (const auto& [name, c] : n.entries) h.entries.push_back({name, c, tree_.get(c).mode});
  ++rt(ino).opens;
  std::uint64_t fh = next_fh_++;
  handles_[fh] = std::move(h);
  return fh;
}

std::vector<dir_entry> filesystem::readdir(std::uint64_t fh, std::uint64_t offset,
                                           std::size_t max) {
  std::lock_guard lk(mu_);
  const handle& h = handle_at(fh);
  std::vector<dir_entry> out;
  for (std::uint64_t i = offset; i < h.entries.size() && out.size() < max; ++i)
    out.push_back(h.entries[i]);
  return out;
}

std::vector<filesystem::dir_entry_plus> filesystem::readdirplus(std::uint64_t fh,
                                                                std::uint64_t offset,
                                                                std::size_t max) {
  lock_t lk(mu_);
  std::vector<dir_entry_plus> out;
  for (std::uint64_t i = offset; out.size() < max; ++i) {
    const handle& h = handle_at(fh);
    if (i >= h.entries.size()) break;
    dir_entry e = h.entries[i];
    if (e.name == "." || e.name == "..") {
      dir_entry_plus p{e, i, {}, false};
      p.st.st_ino = e.ino;
      p.st.st_mode = e.mode;
      out.push_back(p);
      continue;
    }
    wait_idle(lk, e.ino);  // may unlock: the entry is re-checked below
    const inode* n = tree_.find(e.ino);
    if (!n || n->nlink == 0) continue;
    out.push_back({e, i, entry_of(e.ino), true});
  }
  return out;
}

void filesystem::releasedir(std::uint64_t fh) {
  std::lock_guard lk(mu_);
  ino_t ino = handle_at(fh).ino;
  handles_.erase(fh);
  --rt(ino).opens;
  maybe_drop(ino);
}

void filesystem::fsyncdir() {
  sync_journal();
}

struct statvfs filesystem::statfs() {
  struct statvfs sv {};
  if (::statvfs(cfg_.store_dir.c_str(), &sv) != 0) fail(errno, "statfs of the store");
  std::lock_guard lk(mu_);
  sv.f_files = std::max<std::uint64_t>(sv.f_files, tree_.inode_count());
  sv.f_ffree = sv.f_files - std::min<std::uint64_t>(sv.f_files, tree_.inode_count());
  sv.f_favail = sv.f_ffree;
  sv.f_namemax = 255;
  return sv;
}

// ---- xattrs ----

void filesystem::setxattr(ino_t ino, std::string_view name, std::string_view value, int flags) {
  std::lock_guard lk(mu_);
  if (name == info_xattr) fail(EPERM, "user.ckptfs.info is read-only");
  if (name == drop_caches_xattr) {  // a command, not an attribute
    content_.drop_caches();
    log_info("content caches dropped (setxattr " + std::string(drop_caches_xattr) + ")");
    return;
  }
  // No ACLs: storing system.posix_acl_* would show permissions nothing enforces.
  if (name.starts_with("system.")) fail(ENOTSUP, "system.* attributes are not supported");
  journal_ok();
  append(tree_.set_xattr(ino, name, value, flags, now()));
}

std::string filesystem::getxattr(ino_t ino, std::string_view name) {
  lock_t lk(mu_);
  if (name == info_xattr) {
    // Virtual, never listed: how the file is stored (read by `ckptctl stat`).
    wait_idle(lk, ino);
    const inode& n = tree_.get(ino);
    if (!n.is_reg()) fail(ENODATA, "no such xattr");
    if (n.content.version == 0) {
      version_info empty;
      empty.format = "empty";
      empty.kind = "exact";
      return to_json(empty);
    }
    return to_json(content_.info(n.content));
  }
  const inode& n = tree_.get(ino);
  auto it = n.xattrs.find(std::string(name));
  if (it == n.xattrs.end()) fail(ENODATA, "no such xattr");
  return it->second;
}

std::vector<std::string> filesystem::listxattr(ino_t ino) {
  std::lock_guard lk(mu_);
  std::vector<std::string> out;
  for (const auto& [k, v] : tree_.get(ino).xattrs) out.push_back(k);
  return out;
}

void filesystem::removexattr(ino_t ino, std::string_view name) {
  std::lock_guard lk(mu_);
  journal_ok();
  append(tree_.remove_xattr(ino, name, now()));
}

content_ref filesystem::content_of(ino_t ino) {
  lock_t lk(mu_);
  wait_idle(lk, ino);
  return tree_.get(ino).content;
}

}  // namespace ckpt::fs
