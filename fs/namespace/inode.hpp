#pragma once
// The persistent part of an inode: what the journal records and a snapshot recreates. Runtime state
// (kernel lookup counts, open handles, write buffers) lives in fs::filesystem, not here.
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include <cstdint>
#include <map>
#include <string>

#include "fs/content/content_store.hpp"

namespace ckpt::fs {

using ino_t = std::uint64_t;
inline constexpr ino_t root_ino = 1;  // FUSE_ROOT_ID

struct inode {
  ino_t ino = 0;
  std::uint32_t mode = 0;  // type and permission bits, as st_mode
  std::uint32_t nlink = 0;
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::uint64_t rdev = 0;
  timespec atime{}, mtime{}, ctime{};
  content_ref content;                        // regular files: the stored version
  std::string target;                         // symbolic links
  std::map<std::string, std::string> xattrs;  // name -> value (binary)
  std::map<std::string, ino_t> entries;       // directories: name -> child
  ino_t parent = 0;                           // directories: for ".."

  bool is_dir() const { return S_ISDIR(mode); }
  bool is_reg() const { return S_ISREG(mode); }
  bool is_lnk() const { return S_ISLNK(mode); }
  // Logical size as stat reports it (regular files: the committed version).
  std::uint64_t size() const {
    if (is_reg()) return content.size;
    if (is_lnk()) return target.size();
    if (is_dir()) return 4096;
    return 0;
  }
};

}  // namespace ckpt::fs
