#pragma once
// The in-memory namespace: inodes, directory entries, hard and symbolic links, attributes and
// xattrs. Every mutation is one journal record (CBOR, "t": "ns.<op>"): a mutating method checks
// POSIX preconditions (throwing ckpt::io_error with the errno), builds the record, applies it and
// returns it for the caller to append. replay() applies the same records through the same code, so
// the state after a restart is exactly the state the records describe.
//
// Not thread-safe: fs::filesystem serialises access. No FUSE, no content store calls here.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fs/namespace/inode.hpp"

namespace ckpt::fs {

// Which attributes a setattr changes (absent = unchanged). Times are explicit values; the caller
// resolves UTIME_NOW.
struct attr_change {
  std::optional<std::uint32_t> mode;  // permission bits only (type is kept)
  std::optional<std::uint32_t> uid, gid;
  std::optional<timespec> atime, mtime;
};

class namespace_tree {
 public:
  using json = nlohmann::json;

  // An empty filesystem: the root directory only (mode 0755, owner 0:0, times 0 until a record
  // sets them).
  namespace_tree();

  // Lookups. get() throws io_error(ENOENT) for an unknown inode.
  const inode& get(ino_t ino) const;
  inode* find(ino_t ino);
  const inode* find(ino_t ino) const;
  // The child `name` of directory `parent`, or 0. Throws ENOTDIR/ENOENT for a bad parent.
  ino_t child(ino_t parent, std::string_view name) const;

  // Mutations: each returns the record it applied (to be appended to the journal).
  json make_node(ino_t parent, std::string_view name, std::uint32_t mode, std::uint64_t rdev,
                 std::uint32_t uid, std::uint32_t gid, std::string_view symlink_target,
                 timespec now);
  json link(ino_t ino, ino_t new_parent, std::string_view new_name, timespec now);
  // Removes an entry: a non-directory (unlink) or an empty directory (rmdir).
  json remove(ino_t parent, std::string_view name, bool directory, timespec now);
  // flags: 0, RENAME_NOREPLACE or RENAME_EXCHANGE.
  json rename(ino_t parent, std::string_view name, ino_t new_parent, std::string_view new_name,
              unsigned flags, timespec now);
  json set_attr(ino_t ino, const attr_change& change, timespec now);
  // A regular file now reads as `content` (a committed version, or {0,0} for empty).
  json set_content(ino_t ino, const content_ref& content, timespec mtime, timespec now);
  // flags: 0, XATTR_CREATE or XATTR_REPLACE.
  json set_xattr(ino_t ino, std::string_view name, std::string_view value, int flags, timespec now);
  json remove_xattr(ino_t ino, std::string_view name, timespec now);

  // Replay: applies one record; returns false if it is not a namespace record.
  bool replay(const json& record);
  // After replay: drops inodes without names (open-unlinked at the crash) and returns the content
  // versions the remaining inodes reference (one entry per inode).
  std::vector<content_ref> replay_done();

  // Drops an inode that has no names (the caller knows nothing uses it any more).
  void erase(ino_t ino);

  // Records that recreate the whole namespace (for journal::compact()).
  void snapshot(std::vector<json>& out) const;

  std::uint64_t inode_count() const { return inodes_.size(); }
  std::uint64_t records_replayed() const { return replayed_; }

 private:
  void apply(const json& r);
  inode& at(ino_t ino);
  inode& dir_at(ino_t ino);  // throws ENOTDIR
  bool is_ancestor(ino_t maybe_ancestor, ino_t ino) const;

  std::unordered_map<ino_t, inode> inodes_;
  ino_t next_ino_ = root_ino + 1;
  std::uint64_t replayed_ = 0;
};

// Name rules shared by every entry-creating call: non-empty, no '/', not "." or "..", <= 255 bytes.
void check_name(std::string_view name);

}  // namespace ckpt::fs
