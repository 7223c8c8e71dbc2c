// Directories and the filesystem: opendir, readdir, releasedir, fsyncdir, statfs, init.
#include <vector>

#include "fs/fuse/ops.hpp"
#include "fs/fuse/reply.hpp"

namespace ckpt::fs::fuse {
namespace {

void do_init(void*, fuse_conn_info* conn) {
  // One WRITE per MiB (libfuse 3.14's buffer maximum); no writeback cache: the daemon must see
  // every write to buffer it, and files being written use direct I/O anyway.
  conn->max_write = 1 << 20;
  if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC) conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
  conn->want &= ~unsigned(FUSE_CAP_WRITEBACK_CACHE);
  // The kernel clears setuid/setgid bits on write and truncate itself (a setattr we journal),
  // instead of expecting the daemon to do it inside write.
  conn->want &= ~unsigned(FUSE_CAP_HANDLE_KILLPRIV);
}

void do_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  guarded(req, "opendir", [&] {
    filesystem& fsys = fs_of(req);  // the request is freed by the reply
    fi->fh = fsys.opendir(ino);
    fi->cache_readdir = 0;
    const std::uint64_t fh = fi->fh;
    if (fuse_reply_open(req, fi) == -ENOENT) after_reply("opendir", [&] { fsys.releasedir(fh); });
  });
}

void do_readdir(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  guarded(req, "readdir", [&] {
    std::vector<char> buf(size);
    std::size_t used = 0;
    // Entries are small: ask for a generous page of them, stop when the buffer is full.
    auto entries = fs_of(req).readdir(fi->fh, std::uint64_t(off), size / 24 + 1);
    std::uint64_t next = std::uint64_t(off);
    for (const auto& e : entries) {
      struct stat st {};
      st.st_ino = e.ino;
      st.st_mode = e.mode;
      ++next;
      std::size_t n =
          fuse_add_direntry(req, buf.data() + used, size - used, e.name.c_str(), &st, off_t(next));
      if (n > size - used) break;
      used += n;
    }
    fuse_reply_buf(req, buf.data(), used);
  });
}

void do_readdirplus(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  guarded(req, "readdirplus", [&] {
    std::vector<char> buf(size);
    std::size_t used = 0;
    auto entries = fs_of(req).readdirplus(fi->fh, std::uint64_t(off), size / 160 + 1);
    std::size_t sent = 0;
    for (; sent < entries.size(); ++sent) {
      const auto& e = entries[sent];
      fuse_entry_param p{};
      if (e.counted) {
        p = entry_param(req, e.st);
      } else {
        p.attr = e.st;  // "." and "..": no entry, no lookup
      }
      std::size_t n = fuse_add_direntry_plus(req, buf.data() + used, size - used,
                                             e.entry.name.c_str(), &p, off_t(e.index + 1));
      if (n > size - used) break;
      used += n;
    }
    // Entries that did not fit were counted as lookups the kernel never saw.
    for (std::size_t i = sent; i < entries.size(); ++i)
      if (entries[i].counted) fs_of(req).forget(entries[i].entry.ino, 1);
    fuse_reply_buf(req, buf.data(), used);
  });
}

void do_releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  guarded(req, "releasedir", [&] {
    fs_of(req).releasedir(fi->fh);
    fuse_reply_err(req, 0);
  });
}

void do_fsyncdir(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) {
  guarded(req, "fsyncdir", [&] {
    fs_of(req).fsyncdir();
    fuse_reply_err(req, 0);
  });
}

void do_statfs(fuse_req_t req, fuse_ino_t) {
  guarded(req, "statfs", [&] {
    struct statvfs sv = fs_of(req).statfs();
    fuse_reply_statfs(req, &sv);
  });
}

}  // namespace

void add_dir_ops(fuse_lowlevel_ops& ops) {
  ops.init = do_init;
  ops.opendir = do_opendir;
  ops.readdir = do_readdir;
  ops.readdirplus = do_readdirplus;
  ops.releasedir = do_releasedir;
  ops.fsyncdir = do_fsyncdir;
  ops.statfs = do_statfs;
}

fuse_lowlevel_ops make_ops() {
  fuse_lowlevel_ops ops{};
  add_entry_ops(ops);
  add_file_ops(ops);
  add_dir_ops(ops);
  add_xattr_ops(ops);
  return ops;
}

}  // namespace ckpt::fs::fuse
