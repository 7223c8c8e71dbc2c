// fs::filesystem, part 3: file data. Opens, reads (from the write buffer or the committed
// version), writes into the buffer, and the commit of a finished file at its last release or at
// fsync (content_store::put, one record, journal sync, then the old version is released).
#include "fs/namespace/filesystem.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "codec/error.hpp"
#include "fs/namespace/fail.hpp"
#include "fs/namespace/log.hpp"

namespace ckpt::fs {

// ---- files ----

// A reader opening a file its writer has just closed. close() returns once the kernel's FLUSH
// is answered, but the RELEASE that starts the commit follows asynchronously: a read in between
// would be served the bytes as written and a later read the version as stored, which differ for
// a lossy coded checkpoint (torch.save, then torch.load to check it). So the reader waits for
// the RELEASE, and then for the commit, as a reader after it does. A writer's handle that stays
// open after a close() of another descriptor of it (a dup(), in the same process or a child; a
// mapping) ends the wait at the deadline, once per round of writes: that reader gets the bytes
// as written, as every reader before the writer's last close does.
// So does a reader beyond kMaxWaiters at once (the loop has 16 threads: fs/fuse/main.cpp).
void filesystem::wait_for_release(lock_t& lk, ino_t ino) {
  constexpr auto deadline = std::chrono::seconds(1);
  constexpr std::uint32_t kMaxWaiters = 8;
  const auto closing = [&] {
    auto it = rt_.find(ino);
    if (it == rt_.end()) return false;
    const runtime& r = it->second;
    return r.buf && r.dirty && r.writers > 0 && r.writers_closed == r.writers &&
           !r.release_wait_spent;
  };
  if (!closing() || release_waiters_ >= kMaxWaiters) return;
  ++release_waiters_;
  const bool released = idle_cv_.wait_for(lk, deadline, [&] { return !closing(); });
  --release_waiters_;
  if (!released) {
    rt(ino).release_wait_spent = true;
    return;
  }
  wait_idle(lk, ino);
}

void filesystem::note_modified(runtime& r, std::optional<std::uint64_t> fh) {
  r.release_wait_spent = false;
  if (!fh) return;
  if (handle& h = handle_at(*fh); h.closed) {  // changed after a close: not closing after all
    h.closed = false;
    --r.writers_closed;
    idle_cv_.notify_all();  // a reader waiting for this writer's release reads the buffer now
  }
}

open_result filesystem::open(ino_t ino, int flags) {
  lock_t lk(mu_);
  wait_idle(lk, ino);
  bool writable = (flags & O_ACCMODE) != O_RDONLY;
  if (!writable) wait_for_release(lk, ino);
  const inode& n = tree_.get(ino);
  if (n.is_dir()) fail(EISDIR, "open of a directory");
  if (!n.is_reg()) fail(ENXIO, "special files are not served");
  runtime& r = rt(ino);
  open_result res;
  if (writable) {
    if (!r.buf) {
      r.buf = std::make_shared<write_buffer>(budget_, cfg_.staging_dir);
      r.loaded = n.content.size == 0;
    }
    if (flags & O_TRUNC) {
      if (r.loaded ? r.buf->size() != 0 : n.content.size != 0) r.dirty = true;
      r.buf->truncate(0);
      r.loaded = true;
      r.mtime = now();
    }
    ++r.writers;
    r.release_wait_spent = false;  // a new round of writes
    res.direct_io = true;
  } else {
    if (!r.buf) res.image = content_.published_head(n.content);
    if (!r.buf && cfg_.direct_checkpoint_reads && content_.direct_read_ok(n.content)) {
      res.direct_io = true;
    } else {
      res.keep_cache = r.cache_ok && !r.buf;
      if (!r.buf) r.cache_ok = true;
    }
  }
  ++r.opens;
  res.writable = writable;
  res.version = r.buf ? 0 : n.content.version;
  res.fh = add_file_handle(ino, writable);
  if (res.image) handles_.at(res.fh).image = res.image;
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
  r.buf = std::make_shared<write_buffer>(budget_, cfg_.staging_dir);
  r.loaded = true;
  bool writable = (flags & O_ACCMODE) != O_RDONLY;
  if (writable) ++r.writers;
  ++r.opens;
  open_result res;
  res.direct_io = writable;
  res.fh = add_file_handle(ino, writable);
  return {entry_of(ino), res};
}

std::uint64_t filesystem::add_file_handle(ino_t ino, bool writable) {
  const runtime& r = rt(ino);
  handle h;
  h.ino = ino;
  h.writable = writable;
  // Failures some handle claimed are old news; an unclaimed one is reported (runtime::error).
  h.error_since = r.error_claimed;
  h.error_opened = r.error_seq;
  const std::uint64_t fh = next_fh_++;
  handles_[fh] = std::move(h);
  return fh;
}

void filesystem::report_commit_error(std::uint64_t fh) {
  handle& h = handle_at(fh);
  runtime& r = rt(h.ino);  // exists: an open handle keeps its inode's runtime
  if (r.error_seq == h.error_since) return;
  h.error_since = r.error_seq;  // one report covers every failure up to now
  // The failure is older than the handle, which was opened (as a writer reopens its file after
  // close) and learned of it: claimed. A handle that was just open when it happened does not
  // claim it, or a reader closing its descriptor would hide it from the writer's reopen.
  if (h.error_opened == r.error_seq) r.error_claimed = r.error_seq;
  fail(r.error, "an earlier commit of this file failed");
}

std::size_t filesystem::read(std::uint64_t fh, std::uint64_t offset, std::span<std::byte> out) {
  content_reader::view view;
  const std::size_t n = read(fh, offset, out, view);
  // Served from a decoded tensor without a copy: this caller wants the bytes in `out`.
  if (!view.bytes.empty()) std::memcpy(out.data(), view.bytes.data(), n);
  return n;
}

std::size_t filesystem::read(std::uint64_t fh, std::uint64_t offset, std::span<std::byte> out,
                             content_reader::view& zero_copy) {
  zero_copy = {};
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
  zero_copy = reader->peek(offset, out.size());
  if (!zero_copy.bytes.empty()) return zero_copy.bytes.size();
  return reader->read(offset, out);
}

void filesystem::write(std::uint64_t fh, std::uint64_t offset, std::span<const std::byte> data,
                       bool kill_priv) {
  if (offset > max_file_size || data.size() > max_file_size - offset)
    fail(EFBIG, "write past the maximum file size");
  {
    // A writer ahead of its stream waits for it to free memory instead of spilling raw bytes
    // the stream would read back from the disk (write_buffer::wait_for_room); without the lock,
    // so that nothing else waits with it.
    std::shared_ptr<write_buffer> streamed;
    {
      lock_t lk(mu_);
      if (!handle_at(fh).writable) fail(EBADF, "handle not open for writing");
      const auto it = rt_.find(handle_at(fh).ino);
      if (it != rt_.end() && it->second.stream && it->second.stream_buf == it->second.buf)
        streamed = it->second.buf;
    }
    if (streamed) streamed->wait_for_room(offset, data.size());
  }
  lock_t lk(mu_);
  ino_t ino = handle_at(fh).ino;
  if (!handle_at(fh).writable) fail(EBADF, "handle not open for writing");
  wait_idle(lk, ino);
  load(lk, ino);
  runtime& r = rt(ino);
  r.buf->write(offset, data);
  r.dirty = true;
  note_modified(r, fh);
  r.mtime = now();
  maybe_stream(r);
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

void filesystem::fallocate(std::uint64_t fh, int mode, std::uint64_t offset, std::uint64_t length) {
  constexpr int known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
  if (mode & ~known) fail(EOPNOTSUPP, "fallocate mode not supported");
  const bool keep_size = mode & FALLOC_FL_KEEP_SIZE;
  const bool zero = mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE);
  if ((mode & FALLOC_FL_PUNCH_HOLE) && !keep_size) fail(EOPNOTSUPP, "punch hole without keep size");
  if (length == 0) fail(EINVAL, "fallocate of an empty range");
  if (offset > max_file_size || length > max_file_size - offset)
    fail(EFBIG, "fallocate past the maximum file size");
  // Nothing is reserved (the store is compressed; holes read as zeros), but growth the store's
  // filesystem could never hold is refused as a preallocation would be: the part of the range
  // past the file's end (inside it, everything is allocated already, as ext4 sees it).
  struct statvfs sv {};
  const bool have_free =
      !(mode & FALLOC_FL_PUNCH_HOLE) && ::statvfs(cfg_.store_dir.c_str(), &sv) == 0;
  lock_t lk(mu_);
  ino_t ino = handle_at(fh).ino;
  if (!handle_at(fh).writable) fail(EBADF, "handle not open for writing");
  wait_idle(lk, ino);
  load(lk, ino);
  runtime& r = rt(ino);
  const std::uint64_t end = offset + length;
  if (have_free && end > r.buf->size() &&
      std::uint64_t(sv.f_bavail) * sv.f_frsize < end - std::max(offset, r.buf->size()))
    fail(ENOSPC, "fallocate: the store has no room for the range");
  if (zero && offset < r.buf->size()) r.buf->punch_hole(offset, length);
  if (!keep_size && end > r.buf->size()) r.buf->truncate(end);
  // Like ext4, every successful fallocate marks the file modified (mtime and ctime).
  r.dirty = true;
  r.mtime = now();
  note_modified(r, fh);
}

std::uint64_t filesystem::lseek(std::uint64_t fh, std::uint64_t offset, int whence) {
  if (whence != SEEK_DATA && whence != SEEK_HOLE) fail(EINVAL, "lseek: unknown whence");
  std::vector<std::pair<std::uint64_t, std::uint64_t>> runs;
  std::uint64_t size = 0;
  content_ref ref;
  {
    lock_t lk(mu_);
    ino_t ino = handle_at(fh).ino;
    wait_idle(lk, ino);
    runtime& r = rt(ino);
    if (r.buf && r.loaded) {
      runs = r.buf->data_runs();
      size = r.buf->size();
    } else {
      ref = tree_.get(ino).content;
      size = ref.size;
    }
  }
  if (ref.version) runs = content_.data_runs(ref);  // metadata I/O: not under the lock
  if (offset >= size) fail(ENXIO, "lseek past the end of the file");
  for (const auto& [from, to] : runs) {
    if (to <= offset) continue;
    if (whence == SEEK_DATA) return std::max(from, offset);
    if (from > offset) return offset;  // offset lies in the hole before this run
    offset = to;                       // inside data: the hole starts where it ends
  }
  if (whence == SEEK_DATA) fail(ENXIO, "lseek: no data past the offset");
  return std::min(offset, size);  // the end of the file counts as a hole
}

void filesystem::flush(std::uint64_t fh) {
  std::lock_guard lk(mu_);
  // Before the report, which throws: the close() happened whatever it returns.
  if (handle& h = handle_at(fh); h.writable && !h.closed) {
    h.closed = true;
    ++rt(h.ino).writers_closed;
  }
  report_commit_error(fh);
}

void filesystem::maybe_stream(runtime& r) {
  if (!cfg_.stream_after || r.stream || !r.buf || !r.buf->streamable() ||
      r.buf->contiguous() < cfg_.stream_after)
    return;
  // A DCP shard (its stream walks its archives, whatever its byte items start with), or what
  // starts like a torch.save archive.
  std::array<std::byte, 4> magic{};
  if (!r.path.ends_with(".distcp") &&
      (r.buf->read(0, magic) != magic.size() || std::memcmp(magic.data(), "PK\x03\x04", 4) != 0)) {
    r.buf->no_stream();
    return;
  }
  r.buf->begin_stream();
  try {
    r.stream = content_.start_stream(r.path, r.buf);
    r.stream_buf = r.buf;
  } catch (...) {
    r.buf->end_stream();  // no thread: the file is stored at its commit as before
    r.buf->no_stream();
  }
}

std::shared_ptr<content_store::stream> filesystem::take_stream(
    runtime& r, const std::shared_ptr<write_buffer>& buf) {
  if (!r.stream || r.stream_buf != buf) return nullptr;
  r.stream_buf.reset();
  return std::move(r.stream);
}

void filesystem::retire_stream(runtime& r) {
  if (!r.stream || r.stream_buf == r.buf) return;
  r.stream_buf->cancel_stream();
  r.stream_buf.reset();
  auto s = std::move(r.stream);
  try {
    workers_->submit([s = std::move(s)]() mutable { s.reset(); });
  } catch (...) {
    // Could not queue it: joined here (cancelled already, so it ends after its current slab).
  }
}

int filesystem::commit(ino_t ino, const std::shared_ptr<write_buffer>& buf, const std::string& path,
                       timespec mtime, std::shared_ptr<content_store::stream> stream) {
  content_ref fresh;
  bool named = false;  // the inode points at `fresh`
  const auto start = std::chrono::steady_clock::now();
  try {
    std::shared_lock gate(put_gate_);
    if (buf->size() != 0)
      fresh = content_.put(path, std::shared_ptr<staged_file>(buf), std::move(stream));
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
      // Renamed while it was being stored (torch.save into tmpXXXX/, rename, no fsync): the
      // version joins the lineage of its new name now (content_store::renamed).
      if (auto it = rt_.find(ino);
          fresh.version && it != rt_.end() && !it->second.path.empty() && it->second.path != path)
        content_.renamed(fresh, it->second.path);
    }
  } catch (const std::exception& e) {
    int err = errno_of(e);
    if (!named) {  // stored but never named: give the version back
      std::lock_guard lk(mu_);
      release_content(fresh);
    }
    log_error("storing " + path + " (" + std::to_string(buf->size()) +
              " bytes) failed, the file keeps its previous content: " + e.what());
    return err;
  }
  try {
    sync_journal();
  } catch (const std::exception& e) {
    log_error("journal sync after storing " + path + ": " + e.what());
    return errno_of(e);
  }
  if (buf->size() >= (std::uint64_t(16) << 20)) {  // big files only: one line per checkpoint
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    char line[96];
    std::snprintf(line, sizeof line, " (%.1f MiB) in %.2f s, version %llu",
                  double(buf->size()) / (1 << 20), secs, (unsigned long long)fresh.version);
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
  if (h.closed) --r.writers_closed;
  if (h.writable) idle_cv_.notify_all();  // a reader may wait for this release (wait_for_release)
  if (h.writable && --r.writers == 0) {
    r.release_wait_spent = false;  // the round is over: its commit starts here
    const inode* n = tree_.find(ino);
    if (r.dirty && r.loaded && n && n->nlink > 0) {
      // Hand the buffer to a worker: close() does not wait for encoding. Everything that can
      // throw (allocations) happens before `pending` is set, and the job clears it whatever
      // happens inside: a `pending` left set would make every wait for this file hang.
      auto buf = std::shared_ptr<write_buffer>(std::move(r.buf));
      auto job = [this, ino, buf, path = r.path, mtime = r.mtime,
                  stream = take_stream(r, buf)]() mutable {
        // usage() counts the commit as running before it stops counting it as queued, and until
        // the file is idle again (below): never as nothing while the file is pending.
        std::optional<running_commit> running(std::in_place, commits_running_);
        commits_queued_.fetch_sub(1);  // counted before submit (below), also when run inline
        int err = 0;
        try {
          bool linked;
          {
            std::lock_guard g(mu_);
            const inode* n = tree_.find(ino);
            linked = n && n->nlink > 0;
          }
          // Deleted while queued (rmtree of a fresh checkpoint): nothing to store.
          err = linked ? commit(ino, buf, path, mtime, std::move(stream)) : 0;
          stream.reset();  // not used (unlinked): cancelled and joined here
        } catch (...) {
          err = EIO;
        }
        // The buffer's memory and staging file go before the file is idle, not whenever the
        // worker drops this job (unless the content store kept it as a head image).
        buf.reset();
        {
          std::lock_guard g(mu_);
          running.reset();
          auto it = rt_.find(ino);
          if (it != rt_.end()) {
            it->second.pending = false;
            // The writer's handles are closed: the file's other handles and the next opens
            // report it (runtime::error).
            if (err) it->second.commit_failed(err);
          }
          try {
            maybe_drop(ino);
          } catch (...) {
          }
        }
        idle_cv_.notify_all();
        try {
          if (invalidate_) invalidate_(ino);
        } catch (...) {
        }
      };
      r.pending = true;
      r.dirty = false;
      r.loaded = false;
      r.cache_ok = false;
      commits_queued_.fetch_add(1);
      try {
        workers_->submit(job);
      } catch (...) {
        // Could not queue it (out of memory): store it now, on this thread, without mu_.
        lk.unlock();
        job();
      }
      return;
    }
    if (n && n->nlink > 0) {
      r.buf.reset();
      r.loaded = false;
      r.dirty = false;
    }
  }
  if (r.opens == 0 && r.buf && (!tree_.find(ino) || tree_.find(ino)->nlink == 0)) r.buf.reset();
  retire_stream(r);
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
      const std::shared_ptr<write_buffer> buf = r.buf;
      auto stream = take_stream(r, buf);
      lk.unlock();
      std::optional<running_commit> running(std::in_place, commits_running_);
      int err = commit(ino, buf, path, mtime, std::move(stream));
      lk.lock();
      runtime& r2 = rt(ino);
      r2.pending = false;
      running.reset();
      r2.cache_ok = false;
      if (err && buf->modified()) {
        // The store began turning the buffer into the version's head image before the commit
        // failed: its bytes are no longer what was written. The file keeps its previous content,
        // as a failed fsync leaves it on Linux (the error is returned below).
        log_error("fsync of " + path + " failed after the write path had rewritten its buffer; " +
                  "the file keeps its previous content");
        r2.buf = std::make_shared<write_buffer>(budget_, cfg_.staging_dir);
        r2.loaded = tree_.get(ino).content.size == 0;
        r2.commit_failed(err);
        r2.error_claimed = r2.error_seq;
        if (auto h = handles_.find(fh); h != handles_.end()) h->second.error_since = r2.error_seq;
      } else if (err) {
        r2.dirty = true;  // still ours to store at release
        // Returned to this caller below (claimed, and not reported to this handle again); the
        // file's other open handles report it by their next flush or fsync.
        r2.commit_failed(err);
        r2.error_claimed = r2.error_seq;
        if (auto h = handles_.find(fh); h != handles_.end()) h->second.error_since = r2.error_seq;
      } else {
        r2.buf = std::make_shared<write_buffer>(budget_, cfg_.staging_dir);
        r2.loaded = tree_.get(ino).content.size == 0;
      }
      idle_cv_.notify_all();
      // Pages another handle cached from the previous version are stale now (the release path
      // does the same after its commit). The hook only queues the inode: fine under mu_.
      if (!err && invalidate_) invalidate_(ino);
      if (err) fail(err, "fsync: storing the file failed");
      report_commit_error(fh);  // stored now, but a commit failed since this handle last reported
      return;
    }
  }
  report_commit_error(fh);
  lk.unlock();
  sync_journal();
}

content_ref filesystem::content_of(ino_t ino) {
  lock_t lk(mu_);
  wait_idle(lk, ino);
  return tree_.get(ino).content;
}

}  // namespace ckpt::fs
