// Names and attributes: lookup, forget, getattr, setattr, readlink, mknod, mkdir, symlink, link,
// unlink, rmdir, rename.
#include <cstring>

#include "fs/fuse/ops.hpp"
#include "fs/fuse/reply.hpp"

namespace ckpt::fs::fuse {
namespace {

void reply_entry(fuse_req_t req, const struct stat& st) {
  fuse_entry_param e = entry_param(req, st);
  fuse_reply_entry(req, &e);
}

void do_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  guarded(req, "lookup", [&] {
    try {
      reply_entry(req, fs_of(req).lookup(parent, name));
    } catch (const io_error& e) {
      if (e.sys_errno() != ENOENT) throw;
      // A cached negative entry: creations go through us, so the kernel learns of them.
      fuse_entry_param neg{};
      neg.entry_timeout = ctx(req).timeout;
      fuse_reply_entry(req, &neg);
    }
  });
}

void do_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  try {
    fs_of(req).forget(ino, nlookup);
  } catch (const std::exception& e) {
    log_error(std::string("forget: ") + e.what());
  }
  fuse_reply_none(req);
}

void do_forget_multi(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  for (size_t i = 0; i < count; ++i) {
    try {
      fs_of(req).forget(forgets[i].ino, forgets[i].nlookup);
    } catch (const std::exception& e) {
      log_error(std::string("forget: ") + e.what());
    }
  }
  fuse_reply_none(req);
}

void do_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  guarded(req, "getattr", [&] {
    struct stat st = fs_of(req).getattr(ino);
    fuse_reply_attr(req, &st, ctx(req).timeout);
  });
}

timespec now() {
  timespec t{};
  timespec_get(&t, TIME_UTC);
  return t;
}

void do_setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi) {
  guarded(req, "setattr", [&] {
    attr_change c;
    if (to_set & FUSE_SET_ATTR_MODE) c.mode = attr->st_mode;
    if (to_set & FUSE_SET_ATTR_UID) c.uid = attr->st_uid;
    if (to_set & FUSE_SET_ATTR_GID) c.gid = attr->st_gid;
    if (to_set & FUSE_SET_ATTR_ATIME_NOW)
      c.atime = now();
    else if (to_set & FUSE_SET_ATTR_ATIME)
      c.atime = attr->st_atim;
    if (to_set & FUSE_SET_ATTR_MTIME_NOW)
      c.mtime = now();
    else if (to_set & FUSE_SET_ATTR_MTIME)
      c.mtime = attr->st_mtim;
    std::optional<std::uint64_t> size;
    if (to_set & FUSE_SET_ATTR_SIZE) size = std::uint64_t(attr->st_size);
    std::optional<std::uint64_t> fh;
    if (fi) fh = fi->fh;
    struct stat st = fs_of(req).setattr(ino, c, size, fh);
    fuse_reply_attr(req, &st, ctx(req).timeout);
  });
}

void do_readlink(fuse_req_t req, fuse_ino_t ino) {
  guarded(req, "readlink", [&] {
    std::string target = fs_of(req).readlink(ino);
    fuse_reply_readlink(req, target.c_str());
  });
}

void do_mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  guarded(req, "mknod", [&] {
    const fuse_ctx* c = fuse_req_ctx(req);
    reply_entry(req, fs_of(req).mknod(parent, name, mode, rdev, c->uid, c->gid));
  });
}

void do_mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  guarded(req, "mkdir", [&] {
    const fuse_ctx* c = fuse_req_ctx(req);
    reply_entry(req, fs_of(req).mknod(parent, name, S_IFDIR | (mode & 07777), 0, c->uid, c->gid));
  });
}

void do_symlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name) {
  guarded(req, "symlink", [&] {
    const fuse_ctx* c = fuse_req_ctx(req);
    reply_entry(req, fs_of(req).symlink(parent, name, target, c->uid, c->gid));
  });
}

void do_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
  guarded(req, "link", [&] { reply_entry(req, fs_of(req).link(ino, newparent, newname)); });
}

void do_unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  guarded(req, "unlink", [&] {
    fs_of(req).unlink(parent, name);
    fuse_reply_err(req, 0);
  });
}

void do_rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  guarded(req, "rmdir", [&] {
    fs_of(req).rmdir(parent, name);
    fuse_reply_err(req, 0);
  });
}

void do_rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
               const char* newname, unsigned int flags) {
  guarded(req, "rename", [&] {
    fs_of(req).rename(parent, name, newparent, newname, flags);
    fuse_reply_err(req, 0);
  });
}

}  // namespace

fuse_entry_param entry_param(fuse_req_t req, const struct stat& st) {
  fuse_entry_param e{};
  e.ino = st.st_ino;
  e.generation = 1;
  e.attr = st;
  e.attr_timeout = ctx(req).timeout;
  e.entry_timeout = ctx(req).timeout;
  return e;
}

void add_entry_ops(fuse_lowlevel_ops& ops) {
  ops.lookup = do_lookup;
  ops.forget = do_forget;
  ops.forget_multi = do_forget_multi;
  ops.getattr = do_getattr;
  ops.setattr = do_setattr;
  ops.readlink = do_readlink;
  ops.mknod = do_mknod;
  ops.mkdir = do_mkdir;
  ops.symlink = do_symlink;
  ops.link = do_link;
  ops.unlink = do_unlink;
  ops.rmdir = do_rmdir;
  ops.rename = do_rename;
}

}  // namespace ckpt::fs::fuse
