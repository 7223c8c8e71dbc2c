#include "fs/namespace/namespace_tree.hpp"

#include <linux/fs.h>  // RENAME_NOREPLACE, RENAME_EXCHANGE
#include <sys/xattr.h>

#include <cerrno>

#include "codec/error.hpp"

namespace ckpt::fs {
namespace {

using json = nlohmann::json;

[[noreturn]] void fail(int err, std::string_view what) {
  throw io_error(err, std::string(what));
}

// Names, targets and xattr values are bytes, not UTF-8: store them as CBOR byte strings.
json bin(std::string_view s) {
  return json::binary(std::vector<std::uint8_t>(s.begin(), s.end()));
}
std::string str(const json& j) {
  const auto& b = j.get_binary();
  return std::string(b.begin(), b.end());
}
json ts(timespec t) {
  return json::array({std::int64_t(t.tv_sec), std::int64_t(t.tv_nsec)});
}
timespec ts(const json& j) {
  return timespec{time_t(j.at(0).get<std::int64_t>()), long(j.at(1).get<std::int64_t>())};
}

}  // namespace

void check_name(std::string_view name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string_view::npos)
    fail(EINVAL, "invalid name");
  if (name.size() > 255) fail(ENAMETOOLONG, "name too long");
}

namespace_tree::namespace_tree() {
  inode root;
  root.ino = root_ino;
  root.mode = S_IFDIR | 0755;
  root.nlink = 2;
  root.parent = root_ino;  // times 0: a new filesystem records its root's times (ns.attr)
  inodes_.emplace(root_ino, std::move(root));
}

inode* namespace_tree::find(ino_t ino) {
  auto it = inodes_.find(ino);
  return it == inodes_.end() ? nullptr : &it->second;
}
const inode* namespace_tree::find(ino_t ino) const {
  auto it = inodes_.find(ino);
  return it == inodes_.end() ? nullptr : &it->second;
}
const inode& namespace_tree::get(ino_t ino) const {
  if (auto* n = find(ino)) return *n;
  fail(ENOENT, "no such inode");
}
inode& namespace_tree::at(ino_t ino) {
  if (auto* n = find(ino)) return *n;
  fail(ENOENT, "no such inode");
}
inode& namespace_tree::dir_at(ino_t ino) {
  inode& n = at(ino);
  if (!n.is_dir()) fail(ENOTDIR, "not a directory");
  if (n.nlink == 0) fail(ENOENT, "directory was removed");
  return n;
}

ino_t namespace_tree::child(ino_t parent, std::string_view name) const {
  const inode& p = get(parent);
  if (!p.is_dir()) fail(ENOTDIR, "not a directory");
  auto it = p.entries.find(std::string(name));
  return it == p.entries.end() ? 0 : it->second;
}

bool namespace_tree::is_ancestor(ino_t maybe_ancestor, ino_t ino) const {
  for (ino_t cur = ino;;) {
    if (cur == maybe_ancestor) return true;
    if (cur == root_ino) return false;
    const inode* n = find(cur);
    if (!n || n->parent == cur) return false;
    cur = n->parent;
  }
}

// ---- mutations: check, build the record, apply it ----

json namespace_tree::make_node(ino_t parent, std::string_view name, std::uint32_t mode,
                               std::uint64_t rdev, std::uint32_t uid, std::uint32_t gid,
                               std::string_view symlink_target, timespec now) {
  check_name(name);
  dir_at(parent);
  if (child(parent, name)) fail(EEXIST, "entry exists");
  json r = {
      {"t", "ns.mk"}, {"i", next_ino_}, {"p", parent}, {"n", bin(name)},           {"m", mode},
      {"r", rdev},    {"u", uid},       {"g", gid},    {"s", bin(symlink_target)}, {"tm", ts(now)}};
  apply(r);
  return r;
}

json namespace_tree::link(ino_t ino, ino_t new_parent, std::string_view new_name, timespec now) {
  check_name(new_name);
  const inode& n = at(ino);
  if (n.is_dir()) fail(EPERM, "hard link to a directory");
  dir_at(new_parent);
  if (child(new_parent, new_name)) fail(EEXIST, "entry exists");
  if (n.nlink == 0) fail(ENOENT, "file was removed");
  json r = {{"t", "ns.ln"}, {"i", ino}, {"p", new_parent}, {"n", bin(new_name)}, {"tm", ts(now)}};
  apply(r);
  return r;
}

json namespace_tree::remove(ino_t parent, std::string_view name, bool directory, timespec now) {
  dir_at(parent);
  ino_t c = child(parent, name);
  if (!c) fail(ENOENT, "no such entry");
  const inode& n = at(c);
  if (directory) {
    if (!n.is_dir()) fail(ENOTDIR, "not a directory");
    if (!n.entries.empty()) fail(ENOTEMPTY, "directory not empty");
  } else if (n.is_dir()) {
    fail(EISDIR, "is a directory");
  }
  json r = {{"t", "ns.rm"}, {"p", parent}, {"n", bin(name)}, {"tm", ts(now)}};
  apply(r);
  return r;
}

json namespace_tree::rename(ino_t parent, std::string_view name, ino_t new_parent,
                            std::string_view new_name, unsigned flags, timespec now) {
  if (flags & ~unsigned(RENAME_NOREPLACE | RENAME_EXCHANGE)) fail(EINVAL, "unsupported flags");
  if ((flags & RENAME_NOREPLACE) && (flags & RENAME_EXCHANGE)) fail(EINVAL, "conflicting flags");
  check_name(new_name);
  dir_at(parent);
  dir_at(new_parent);
  ino_t src = child(parent, name);
  if (!src) fail(ENOENT, "no such entry");
  ino_t dst = child(new_parent, new_name);
  const inode& s = at(src);
  if (flags & RENAME_EXCHANGE) {
    if (!dst) fail(ENOENT, "exchange target missing");
    const inode& d = at(dst);
    if (s.is_dir() && is_ancestor(src, new_parent)) fail(EINVAL, "move into own subdirectory");
    if (d.is_dir() && is_ancestor(dst, parent)) fail(EINVAL, "move into own subdirectory");
  } else {
    if (dst && (flags & RENAME_NOREPLACE)) fail(EEXIST, "target exists");
    if (s.is_dir() && is_ancestor(src, new_parent)) fail(EINVAL, "move into own subdirectory");
    if (dst && dst != src) {
      const inode& d = at(dst);
      if (s.is_dir() && !d.is_dir()) fail(ENOTDIR, "target is not a directory");
      if (!s.is_dir() && d.is_dir()) fail(EISDIR, "target is a directory");
      if (d.is_dir() && !d.entries.empty()) fail(ENOTEMPTY, "target directory not empty");
    }
  }
  json r = {{"t", "ns.mv"},       {"p", parent}, {"n", bin(name)}, {"q", new_parent},
            {"o", bin(new_name)}, {"f", flags},  {"tm", ts(now)}};
  apply(r);
  return r;
}

json namespace_tree::set_attr(ino_t ino, const attr_change& c, timespec now) {
  at(ino);
  json r = {{"t", "ns.attr"}, {"i", ino}, {"tm", ts(now)}};
  if (c.mode) r["m"] = *c.mode & 07777;
  if (c.uid) r["u"] = *c.uid;
  if (c.gid) r["g"] = *c.gid;
  if (c.atime) r["a"] = ts(*c.atime);
  if (c.mtime) r["mt"] = ts(*c.mtime);
  apply(r);
  return r;
}

json namespace_tree::set_content(ino_t ino, const content_ref& content, timespec mtime,
                                 timespec now) {
  if (!at(ino).is_reg()) fail(EINVAL, "not a regular file");
  json r = {{"t", "ns.data"},    {"i", ino},        {"v", content.version},
            {"z", content.size}, {"mt", ts(mtime)}, {"tm", ts(now)}};
  apply(r);
  return r;
}

json namespace_tree::set_xattr(ino_t ino, std::string_view name, std::string_view value, int flags,
                               timespec now) {
  const inode& n = at(ino);
  if (name.empty() || name.size() > XATTR_NAME_MAX) fail(ERANGE, "bad xattr name");
  if (value.size() > XATTR_SIZE_MAX) fail(E2BIG, "xattr value too large");
  bool exists = n.xattrs.count(std::string(name)) != 0;
  if ((flags & XATTR_CREATE) && exists) fail(EEXIST, "xattr exists");
  if ((flags & XATTR_REPLACE) && !exists) fail(ENODATA, "no such xattr");
  json r = {{"t", "ns.xs"}, {"i", ino}, {"k", bin(name)}, {"v", bin(value)}, {"tm", ts(now)}};
  apply(r);
  return r;
}

json namespace_tree::remove_xattr(ino_t ino, std::string_view name, timespec now) {
  const inode& n = at(ino);
  if (!n.xattrs.count(std::string(name))) fail(ENODATA, "no such xattr");
  json r = {{"t", "ns.xr"}, {"i", ino}, {"k", bin(name)}, {"tm", ts(now)}};
  apply(r);
  return r;
}

// ---- apply: no checks (records were checked when made), deterministic ----

void namespace_tree::apply(const json& r) {
  const std::string& t = r.at("t").get_ref<const std::string&>();
  auto touch_dir = [](inode& d, timespec now) { d.mtime = d.ctime = now; };
  // Drops an entry's name: one link less; a directory loses its "." and its parent's "..".
  auto unname = [&](inode& parent, inode& victim, timespec now) {
    if (victim.is_dir()) {
      victim.nlink = 0;
      --parent.nlink;
    } else if (victim.nlink > 0) {
      --victim.nlink;
    }
    victim.ctime = now;
  };

  if (t == "ns.mk") {
    timespec now = ts(r.at("tm"));
    inode n;
    n.ino = r.at("i");
    n.mode = r.at("m");
    n.rdev = r.at("r");
    n.uid = r.at("u");
    n.gid = r.at("g");
    n.target = str(r.at("s"));
    n.atime = n.mtime = n.ctime = now;
    inode& p = at(r.at("p"));
    if (n.is_dir()) {
      n.nlink = 2;
      n.parent = p.ino;
      ++p.nlink;
    } else {
      n.nlink = 1;
    }
    p.entries[str(r.at("n"))] = n.ino;
    touch_dir(p, now);
    if (n.ino >= next_ino_) next_ino_ = n.ino + 1;
    inodes_[n.ino] = std::move(n);
  } else if (t == "ns.ln") {
    timespec now = ts(r.at("tm"));
    inode& n = at(r.at("i"));
    inode& p = at(r.at("p"));
    p.entries[str(r.at("n"))] = n.ino;
    ++n.nlink;
    n.ctime = now;
    touch_dir(p, now);
  } else if (t == "ns.rm") {
    timespec now = ts(r.at("tm"));
    inode& p = at(r.at("p"));
    auto it = p.entries.find(str(r.at("n")));
    inode& victim = at(it->second);
    p.entries.erase(it);
    unname(p, victim, now);
    touch_dir(p, now);
  } else if (t == "ns.mv") {
    timespec now = ts(r.at("tm"));
    unsigned flags = r.at("f");
    inode& p = at(r.at("p"));
    inode& q = at(r.at("q"));
    std::string name = str(r.at("n")), new_name = str(r.at("o"));
    ino_t src = p.entries.at(name);
    auto dst_it = q.entries.find(new_name);
    ino_t dst = dst_it == q.entries.end() ? 0 : dst_it->second;
    inode& s = at(src);
    if (flags & RENAME_EXCHANGE) {
      inode& d = at(dst);
      p.entries[name] = dst;
      q.entries[new_name] = src;
      if (p.ino != q.ino) {
        if (s.is_dir()) {
          --p.nlink;
          ++q.nlink;
          s.parent = q.ino;
        }
        if (d.is_dir()) {
          --q.nlink;
          ++p.nlink;
          d.parent = p.ino;
        }
      }
      s.ctime = d.ctime = now;
    } else if (dst == src) {
      // Two names of one inode (or the same name): rename does nothing.
      return;
    } else {
      if (dst) {
        inode& d = at(dst);
        q.entries.erase(dst_it);
        unname(q, d, now);
      }
      p.entries.erase(name);
      q.entries[new_name] = src;
      if (s.is_dir() && p.ino != q.ino) {
        --p.nlink;
        ++q.nlink;
        s.parent = q.ino;
      }
      s.ctime = now;
    }
    touch_dir(p, now);
    touch_dir(q, now);
  } else if (t == "ns.attr") {
    inode& n = at(r.at("i"));
    if (r.contains("m")) n.mode = (n.mode & S_IFMT) | (r.at("m").get<std::uint32_t>() & 07777);
    if (r.contains("u")) n.uid = r.at("u");
    if (r.contains("g")) n.gid = r.at("g");
    if (r.contains("a")) n.atime = ts(r.at("a"));
    if (r.contains("mt")) n.mtime = ts(r.at("mt"));
    n.ctime = ts(r.at("tm"));
  } else if (t == "ns.data") {
    inode& n = at(r.at("i"));
    n.content = content_ref{r.at("v"), r.at("z")};
    n.mtime = ts(r.at("mt"));
    n.ctime = ts(r.at("tm"));
  } else if (t == "ns.xs") {
    inode& n = at(r.at("i"));
    n.xattrs[str(r.at("k"))] = str(r.at("v"));
    n.ctime = ts(r.at("tm"));
  } else if (t == "ns.xr") {
    inode& n = at(r.at("i"));
    n.xattrs.erase(str(r.at("k")));
    n.ctime = ts(r.at("tm"));
  } else if (t == "ns.inode") {  // snapshot: one whole inode (entries come as ns.dent)
    inode n;
    n.ino = r.at("i");
    n.mode = r.at("m");
    n.nlink = r.at("l");
    n.uid = r.at("u");
    n.gid = r.at("g");
    n.rdev = r.at("r");
    n.atime = ts(r.at("a"));
    n.mtime = ts(r.at("mt"));
    n.ctime = ts(r.at("c"));
    n.content = content_ref{r.at("v"), r.at("z")};
    n.target = str(r.at("s"));
    n.parent = r.at("p");
    for (const auto& x : r.at("x")) n.xattrs[str(x.at(0))] = str(x.at(1));
    if (n.ino >= next_ino_) next_ino_ = n.ino + 1;
    inodes_[n.ino] = std::move(n);
  } else if (t == "ns.dent") {
    at(r.at("p")).entries[str(r.at("n"))] = r.at("i").get<ino_t>();
  } else {
    throw corrupt_error("journal: unknown namespace record " + t);
  }
}

bool namespace_tree::replay(const json& record) {
  auto t = record.find("t");
  if (t == record.end() || !t->is_string()) return false;
  const std::string& s = t->get_ref<const std::string&>();
  if (s.rfind("ns.", 0) != 0) return false;
  try {
    apply(record);
    ++replayed_;
  } catch (const nlohmann::json::exception& e) {
    throw corrupt_error(std::string("journal: malformed namespace record: ") + e.what());
  } catch (const std::out_of_range& e) {
    throw corrupt_error(std::string("journal: namespace record names a missing entry: ") +
                        e.what());
  }
  return true;
}

std::vector<content_ref> namespace_tree::replay_done() {
  std::vector<content_ref> live;
  for (auto it = inodes_.begin(); it != inodes_.end();) {
    if (it->second.nlink == 0 && it->first != root_ino) {
      it = inodes_.erase(it);
      continue;
    }
    if (it->second.is_reg() && it->second.content.version != 0) live.push_back(it->second.content);
    ++it;
  }
  return live;
}

void namespace_tree::erase(ino_t ino) {
  if (ino != root_ino) inodes_.erase(ino);
}

void namespace_tree::snapshot(std::vector<json>& out) const {
  for (const auto& [ino, n] : inodes_) {
    if (n.nlink == 0 && ino != root_ino) continue;  // open-unlinked: gone after a restart anyway
    json x = json::array();
    for (const auto& [k, v] : n.xattrs) x.push_back(json::array({bin(k), bin(v)}));
    out.push_back({{"t", "ns.inode"},
                   {"i", ino},
                   {"m", n.mode},
                   {"l", n.nlink},
                   {"u", n.uid},
                   {"g", n.gid},
                   {"r", n.rdev},
                   {"a", ts(n.atime)},
                   {"mt", ts(n.mtime)},
                   {"c", ts(n.ctime)},
                   {"v", n.content.version},
                   {"z", n.content.size},
                   {"s", bin(n.target)},
                   {"p", n.parent},
                   {"x", std::move(x)}});
  }
  for (const auto& [ino, n] : inodes_)
    for (const auto& [name, c] : n.entries)
      out.push_back({{"t", "ns.dent"}, {"p", ino}, {"n", bin(name)}, {"i", c}});
}

}  // namespace ckpt::fs
