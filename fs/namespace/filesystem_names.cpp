// fs::filesystem, part 2: names and attributes (lookup, forget, getattr, setattr, links,
// rename), directories, statfs and xattrs. Each mutation is one journal record.
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
    // Runtime state of a named, idle, forgotten inode is not needed any more, unless it holds a
    // failed commit no handle claimed: the next open must report it (runtime::error). Handles
    // that have not reported a failure yet are open, so they keep it too. A claimed failure
    // goes with the state: later opens would not report it anyway.
    auto again = rt_.find(ino);
    if (again != rt_.end() && !again->second.opens && !again->second.pending &&
        !again->second.buf && !again->second.error_unclaimed() && !again->second.nlookup)
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
    if (*size > max_file_size) fail(EFBIG, "truncate past the maximum file size");
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
      // ftruncate through a writable handle (a path truncate names none).
      const bool by_writer = fh && handles_.count(*fh) && handles_.at(*fh).writable;
      note_modified(r2, by_writer ? fh : std::nullopt);
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
        const std::shared_ptr<write_buffer> buf = r2.buf;
        lk.unlock();
        std::optional<running_commit> running(std::in_place, commits_running_);
        int err = commit(ino, buf, path, now());
        lk.lock();
        runtime& r3 = rt(ino);
        r3.pending = false;
        running.reset();
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
  if (src) rejoin_lineages(src, path_of(new_parent, new_name));
}

// Files moved by a rename tell the content store their new names: a step directory written under
// a temporary name and renamed joins its shards to their ranks' lineages (content_store::renamed).
// A file still being stored under its old name is told by its commit (filesystem_files.cpp).
// Bounded: a rename of a large tree walks at most kRejoinMax files.
void filesystem::rejoin_lineages(ino_t ino, const std::string& path) {
  constexpr std::size_t kRejoinMax = 4096;
  std::vector<std::pair<ino_t, std::string>> work{{ino, path}};
  for (std::size_t seen = 0; !work.empty() && seen < kRejoinMax; ++seen) {
    auto [cur, p] = std::move(work.back());
    work.pop_back();
    const inode* n = tree_.find(cur);
    if (!n) continue;
    if (n->is_reg()) {
      // A file below a renamed directory: its next commit goes under its new name.
      if (auto it = rt_.find(cur); it != rt_.end()) it->second.path = p;
      if (n->content.version) content_.renamed(n->content, p);
    } else if (n->is_dir()) {
      for (const auto& [name, c] : n->entries) work.emplace_back(c, p + "/" + name);
    }
  }
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
  if (name == store_xattr) fail(EPERM, "user.ckptfs.store is read-only");
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
  if (name == store_xattr) {
    tree_.get(ino);  // ENOENT for a stale inode
    return cfg_.store_dir;
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

}  // namespace ckpt::fs
