#pragma once
// The FUSE low-level operation table: thin translations of requests onto fs::filesystem.
#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>

#include <atomic>
#include <optional>

#include "fs/fuse/inval_notifier.hpp"
#include "fs/fuse/passthrough.hpp"

#include "fs/namespace/filesystem.hpp"

namespace ckpt::fs::fuse {

// Session userdata (fuse_req_userdata).
struct context {
  filesystem* fs = nullptr;
  fuse_session* session = nullptr;
  double timeout = 86400.0;  // entry and attribute cache: every change goes through us
  std::atomic<bool> serving{false};
  std::optional<inval_notifier> notifier;  // commits post invalidations here, never block on them
  passthrough* pt = nullptr;  // the transport hooks (set before the session loop starts)
};

inline context& ctx(fuse_req_t req) {
  return *static_cast<context*>(fuse_req_userdata(req));
}
inline filesystem& fs_of(fuse_req_t req) {
  return *ctx(req).fs;
}

fuse_lowlevel_ops make_ops();

// Per op family (ops_entry.cpp, ops_file.cpp, ops_dir.cpp, ops_xattr.cpp).
void add_entry_ops(fuse_lowlevel_ops& ops);
void add_file_ops(fuse_lowlevel_ops& ops);
void add_dir_ops(fuse_lowlevel_ops& ops);
void add_xattr_ops(fuse_lowlevel_ops& ops);

// A fuse_entry_param for `st` with the context's timeouts.
fuse_entry_param entry_param(fuse_req_t req, const struct stat& st);

}  // namespace ckpt::fs::fuse
