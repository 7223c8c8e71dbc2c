// Extended attributes: any namespace, stored as bytes in the inode (journaled).
#include <string>

#include "fs/fuse/ops.hpp"
#include "fs/fuse/reply.hpp"

namespace ckpt::fs::fuse {
namespace {

// getxattr/listxattr protocol: size 0 asks for the length; a too-small buffer is ERANGE.
void reply_sized(fuse_req_t req, const std::string& value, size_t size) {
  if (size == 0)
    fuse_reply_xattr(req, value.size());
  else if (size < value.size())
    fuse_reply_err(req, ERANGE);
  else
    fuse_reply_buf(req, value.data(), value.size());
}

void do_setxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
                 int flags) {
  guarded(req, "setxattr", [&] {
    fs_of(req).setxattr(ino, name, std::string_view(value, size), flags);
    fuse_reply_err(req, 0);
  });
}

void do_getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  guarded(req, "getxattr", [&] { reply_sized(req, fs_of(req).getxattr(ino, name), size); });
}

void do_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  guarded(req, "listxattr", [&] {
    std::string names;
    for (const auto& n : fs_of(req).listxattr(ino)) {
      names += n;
      names += '\0';
    }
    reply_sized(req, names, size);
  });
}

void do_removexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  guarded(req, "removexattr", [&] {
    fs_of(req).removexattr(ino, name);
    fuse_reply_err(req, 0);
  });
}

}  // namespace

void add_xattr_ops(fuse_lowlevel_ops& ops) {
  ops.setxattr = do_setxattr;
  ops.getxattr = do_getxattr;
  ops.listxattr = do_listxattr;
  ops.removexattr = do_removexattr;
}

}  // namespace ckpt::fs::fuse
