// File data: open, create, read, write, flush, release, fsync, fallocate, lseek.
#include <vector>

#include "fs/fuse/ops.hpp"
#include "fs/fuse/reply.hpp"

namespace ckpt::fs::fuse {
namespace {

void set_open_flags(fuse_file_info* fi, const open_result& r) {
  fi->fh = r.fh;
  fi->keep_cache = r.keep_cache;
  fi->direct_io = r.direct_io;
}

void do_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  guarded(req, "open", [&] {
    filesystem& fsys = fs_of(req);  // the request is freed by the reply
    passthrough* pt = ctx(req).pt;
    open_result r = fsys.open(ino, fi->flags);
    set_open_flags(fi, r);
    if (pt) {
      // A newest version with its image on disk is read by the kernel itself (passthrough.hpp).
      const auto c = pt->decide(r.fh, ino, r.version, r.image ? r.image->backing_fd() : -1,
                                r.writable, r.direct_io);
      if (c.passthrough) fi->keep_cache = 0;
      fi->direct_io = c.direct_io;
      if (c.exposed) fsys.discard_head(c.exposed);
    }
    if (fuse_reply_open(req, fi) == -ENOENT)  // interrupted open
      after_reply("open", [&] {
        if (pt) pt->release(r.fh);
        fsys.release(r.fh);
      });
  });
}

void do_create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
               fuse_file_info* fi) {
  guarded(req, "create", [&] {
    filesystem& fsys = fs_of(req);  // the request is freed by the reply
    const fuse_ctx* c = fuse_req_ctx(req);
    auto [st, r] = fsys.create(parent, name, mode, fi->flags, c->uid, c->gid);
    set_open_flags(fi, r);
    fuse_entry_param e = entry_param(req, st);
    const std::uint64_t fh = r.fh;
    if (fuse_reply_create(req, &e, fi) == -ENOENT) after_reply("create", [&] { fsys.release(fh); });
  });
}

void do_read(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  guarded(req, "read", [&] {
    thread_local std::vector<std::byte> buf;
    if (buf.size() < size) buf.resize(size);
    content_reader::view held;  // bytes already in memory: sent from there, without a copy
    const std::size_t n =
        fs_of(req).read(fi->fh, std::uint64_t(off), std::span(buf).first(size), held);
    if (held.bytes.empty()) {
      fuse_reply_buf(req, reinterpret_cast<const char*>(buf.data()), n);
      return;
    }
    // One memory buffer and no splice: libfuse writes it to the device straight from `held`
    // (one iovec), which stays alive until the reply returns.
    fuse_bufvec bv = FUSE_BUFVEC_INIT(n);
    bv.buf[0].mem = const_cast<std::byte*>(held.bytes.data());
    fuse_reply_data(req, &bv, FUSE_BUF_NO_SPLICE);
  });
}

void do_write(fuse_req_t req, fuse_ino_t, const char* data, size_t size, off_t off,
              fuse_file_info* fi) {
  guarded(req, "write", [&] {
    // Files being written use direct I/O, where the kernel leaves clearing setuid/setgid on
    // write to the server. Root stands in for CAP_FSETID.
    fs_of(req).write(fi->fh, std::uint64_t(off),
                     std::span(reinterpret_cast<const std::byte*>(data), size),
                     fuse_req_ctx(req)->uid != 0);
    fuse_reply_write(req, size);
  });
}

void do_flush(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  guarded(req, "flush", [&] {
    fs_of(req).flush(fi->fh);
    fuse_reply_err(req, 0);
  });
}

// The end of a file (not flush: numpy dup()s the fd). The kernel ignores the reply's errno; a
// failure of the commit it starts is reported by the flush/fsync of the file's other handles and
// of later opens (filesystem::runtime::error).
void do_release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  guarded(req, "release", [&] {
    if (passthrough* pt = ctx(req).pt) pt->release(fi->fh);
    fs_of(req).release(fi->fh);
    fuse_reply_err(req, 0);
  });
}

void do_fsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info* fi) {
  guarded(req, "fsync", [&] {
    fs_of(req).fsync(fi->fh);
    fuse_reply_err(req, 0);
  });
}

void do_fallocate(fuse_req_t req, fuse_ino_t, int mode, off_t offset, off_t length,
                  fuse_file_info* fi) {
  guarded(req, "fallocate", [&] {
    if (offset < 0 || length <= 0) throw io_error(EINVAL, "fallocate: bad range");
    fs_of(req).fallocate(fi->fh, mode, std::uint64_t(offset), std::uint64_t(length));
    fuse_reply_err(req, 0);
  });
}

// Only SEEK_DATA and SEEK_HOLE reach here; the kernel answers the others itself.
void do_lseek(fuse_req_t req, fuse_ino_t, off_t off, int whence, fuse_file_info* fi) {
  guarded(req, "lseek", [&] {
    if (off < 0) throw io_error(ENXIO, "lseek: negative offset");
    fuse_reply_lseek(req, off_t(fs_of(req).lseek(fi->fh, std::uint64_t(off), whence)));
  });
}

}  // namespace

void add_file_ops(fuse_lowlevel_ops& ops) {
  ops.open = do_open;
  ops.create = do_create;
  ops.read = do_read;
  ops.write = do_write;
  ops.flush = do_flush;
  ops.release = do_release;
  ops.fsync = do_fsync;
  ops.fallocate = do_fallocate;
  ops.lseek = do_lseek;
}

}  // namespace ckpt::fs::fuse
