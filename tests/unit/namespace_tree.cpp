// fs/namespace: POSIX rules of the namespace, and the journal contract: replaying the records a
// sequence of mutations returned, or a snapshot of the result, rebuilds exactly the same tree.
#include <linux/fs.h>
#include <sys/xattr.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "codec/error.hpp"
#include "fs/namespace/namespace_tree.hpp"
#include "namespace_test_util.hpp"

using ckpt::fs::attr_change;
using ckpt::fs::namespace_tree;
using ckpt::fs::root_ino;
using json = nlohmann::json;

namespace {

timespec t0{1000, 5};

using ckpt::test::errno_of;

std::uint64_t mk(namespace_tree& t, std::uint64_t parent, const std::string& name, bool dir) {
  auto r = t.make_node(parent, name, dir ? (S_IFDIR | 0755) : (S_IFREG | 0644), 0, 0, 0, {}, t0);
  return r.at("i");
}

// A canonical form of the whole tree (snapshot records are in hash-map order).
std::vector<std::string> canonical(const namespace_tree& t) {
  std::vector<json> snap;
  t.snapshot(snap);
  std::vector<std::string> out;
  for (auto& j : snap) out.push_back(j.dump());
  std::sort(out.begin(), out.end());
  return out;
}

// The first record present in one canonical form and not the other ("" if equal).
std::string first_difference(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  for (const auto& x : a)
    if (!std::binary_search(b.begin(), b.end(), x)) return "only in the first: " + x;
  for (const auto& x : b)
    if (!std::binary_search(a.begin(), a.end(), x)) return "only in the second: " + x;
  return "";
}

}  // namespace

TEST_CASE("namespace: entries and links and directory link counts", "[namespace]") {
  namespace_tree t;
  auto d = mk(t, root_ino, "d", true);
  auto f = mk(t, d, "f", false);
  CHECK(t.get(root_ino).nlink == 3);
  CHECK(t.get(d).nlink == 2);
  CHECK(errno_of([&] { mk(t, d, "f", false); }) == EEXIST);
  CHECK(errno_of([&] { mk(t, f, "x", false); }) == ENOTDIR);
  CHECK(errno_of([&] { mk(t, d, std::string(256, 'n'), false); }) == ENAMETOOLONG);
  t.link(f, root_ino, "g", t0);
  CHECK(t.get(f).nlink == 2);
  CHECK(errno_of([&] { t.link(d, root_ino, "dl", t0); }) == EPERM);
  CHECK(errno_of([&] { t.remove(root_ino, "d", true, t0); }) == ENOTEMPTY);
  CHECK(errno_of([&] { t.remove(root_ino, "d", false, t0); }) == EISDIR);
  CHECK(errno_of([&] { t.remove(root_ino, "g", true, t0); }) == ENOTDIR);
  t.remove(d, "f", false, t0);
  CHECK(t.get(f).nlink == 1);
  t.remove(root_ino, "d", true, t0);
  CHECK(t.get(root_ino).nlink == 2);
  CHECK(t.get(d).nlink == 0);
}

TEST_CASE("namespace: rename rules and flags", "[namespace]") {
  namespace_tree t;
  auto a = mk(t, root_ino, "a", true);
  auto b = mk(t, root_ino, "b", true);
  auto sub = mk(t, a, "sub", true);
  auto f = mk(t, a, "f", false);
  auto g = mk(t, b, "g", false);
  mk(t, b, "full", true);
  mk(t, t.child(b, "full"), "x", false);

  CHECK(errno_of([&] { t.rename(root_ino, "a", sub, "a2", 0, t0); }) == EINVAL);
  CHECK(errno_of([&] { t.rename(a, "f", b, "full", 0, t0); }) == EISDIR);
  CHECK(errno_of([&] { t.rename(a, "sub", b, "g", 0, t0); }) == ENOTDIR);
  CHECK(errno_of([&] { t.rename(root_ino, "a", b, "full", 0, t0); }) == ENOTEMPTY);
  CHECK(errno_of([&] { t.rename(a, "f", b, "g", RENAME_NOREPLACE, t0); }) == EEXIST);
  CHECK(errno_of([&] { t.rename(a, "f", b, "none", RENAME_EXCHANGE, t0); }) == ENOENT);
  CHECK(errno_of([&] { t.rename(a, "none", b, "g", 0, t0); }) == ENOENT);

  // Replacing a file: the old one loses its name.
  t.rename(a, "f", b, "g", 0, t0);
  CHECK(t.child(b, "g") == f);
  CHECK(t.child(a, "f") == 0);
  CHECK(t.get(g).nlink == 0);

  // Moving a directory across parents moves a ".." link.
  t.rename(a, "sub", b, "sub", 0, t0);
  CHECK(t.get(a).nlink == 2);
  CHECK(t.get(b).nlink == 4);
  CHECK(t.get(sub).parent == b);

  // Exchange of a directory and a file across parents.
  auto h = mk(t, a, "h", false);
  t.rename(b, "sub", a, "h", RENAME_EXCHANGE, t0);
  CHECK(t.child(a, "h") == sub);
  CHECK(t.child(b, "sub") == h);
  CHECK(t.get(a).nlink == 3);
  CHECK(t.get(b).nlink == 3);

  // Two names of one inode: rename is a no-op.
  t.link(f, a, "f2", t0);
  t.rename(a, "f2", b, "g", 0, t0);
  CHECK(t.child(a, "f2") == f);
  CHECK(t.get(f).nlink == 2);
}

TEST_CASE("namespace: xattr flags", "[namespace]") {
  namespace_tree t;
  auto f = mk(t, root_ino, "f", false);
  CHECK(errno_of([&] { t.set_xattr(f, "user.a", "1", XATTR_REPLACE, t0); }) == ENODATA);
  t.set_xattr(f, "user.a", std::string("\0\xff", 2), XATTR_CREATE, t0);
  CHECK(errno_of([&] { t.set_xattr(f, "user.a", "1", XATTR_CREATE, t0); }) == EEXIST);
  CHECK(t.get(f).xattrs.at("user.a") == std::string("\0\xff", 2));
  t.remove_xattr(f, "user.a", t0);
  CHECK(errno_of([&] { t.remove_xattr(f, "user.a", t0); }) == ENODATA);
}

TEST_CASE("namespace: replay of the records or of a snapshot rebuilds the same tree",
          "[namespace]") {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](std::size_t n) { return std::size_t(rng() % n); };
    namespace_tree live;
    std::vector<json> records;
    const char* names[] = {"a", "b", "c", "\xff\xfe", "e.pt"};
    for (int step = 0; step < 400; ++step) {
      // Random existing inode numbers and names; errors are fine (no record then).
      std::vector<std::uint64_t> dirs{root_ino}, all;
      std::vector<json> snap;
      live.snapshot(snap);
      for (auto& r : snap)
        if (r["t"] == "ns.inode") {
          all.push_back(r["i"]);
          if (S_ISDIR(r["m"].get<std::uint32_t>()) && r["l"].get<std::uint32_t>() > 0)
            dirs.push_back(r["i"]);
        }
      auto d = dirs[pick(dirs.size())], d2 = dirs[pick(dirs.size())];
      auto i = all[pick(all.size())];
      std::string n = names[pick(5)], n2 = names[pick(5)];
      timespec now{time_t(2000 + step), long(step)};
      try {
        switch (pick(9)) {
          case 0:
          case 1:
            records.push_back(live.make_node(d, n, pick(2) ? (S_IFDIR | 0700) : (S_IFREG | 0600), 0,
                                             1, 2, {}, now));
            break;
          case 2:
            records.push_back(live.make_node(d, n, S_IFLNK | 0777, 0, 0, 0, "target/x", now));
            break;
          case 3:
            records.push_back(live.link(i, d, n, now));
            break;
          case 4:
            records.push_back(live.remove(d, n, pick(2), now));
            break;
          case 5:
            records.push_back(live.rename(d, n, d2, n2, std::array{0u, 0u, 1u, 2u}[pick(4)], now));
            break;
          case 6: {
            attr_change c;
            c.mode = 0640;
            c.mtime = now;
            records.push_back(live.set_attr(i, c, now));
            break;
          }
          case 7:
            records.push_back(live.set_xattr(i, "user.k", std::string(pick(40), '\0'), 0, now));
            break;
          case 8:
            if (live.get(i).is_reg())
              records.push_back(live.set_content(i, {std::uint64_t(step), 99}, now, now));
            break;
        }
      } catch (const ckpt::io_error&) {
      }
    }
    namespace_tree replayed;
    for (auto& r : records) {
      auto bytes = json::to_cbor(r);  // through CBOR, as the journal stores them
      REQUIRE(replayed.replay(json::from_cbor(bytes)));
    }
    INFO("seed " << seed);
    REQUIRE(first_difference(canonical(replayed), canonical(live)) == "");

    std::vector<json> snap;
    live.snapshot(snap);
    namespace_tree from_snapshot;
    for (auto& r : snap) REQUIRE(from_snapshot.replay(json::from_cbor(json::to_cbor(r))));
    REQUIRE(first_difference(canonical(from_snapshot), canonical(live)) == "");
    CHECK_FALSE(from_snapshot.replay(json{{"t", "c.put"}}));
  }
}
