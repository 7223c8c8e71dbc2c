// fs::filesystem without FUSE, on a real store in a temporary directory: the write path (buffer,
// commit at the last release, pending waits), reads, unlinked-open files, fsync, truncate,
// concurrent writers, a restart that replays the journal, and how failed commits (objects on a
// full tmpfs: ENOSPC) are reported to the file's handles.
#include <fcntl.h>
#include <linux/fs.h>

#include <atomic>
#include <boost/filesystem.hpp>
#include <catch2/catch.hpp>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "codec/error.hpp"
#include "fs/content/content_store.hpp"
#include "fs/namespace/filesystem.hpp"
#include "fs/store/journal.hpp"
#include "fs/store/object_store.hpp"
#include "namespace_test_util.hpp"
#include "store_test_util.hpp"

namespace bf = boost::filesystem;
using namespace ckpt::fs;
using namespace ckpt::test;

namespace {

using ckpt::test::errno_of;

}  // namespace

TEST_CASE("filesystem: write and release and read back and restart", "[namespace]") {
  temp_store tmp;
  std::string big(3 << 20, 'x');
  for (std::size_t i = 0; i < big.size(); i += 4093) big[i] = char(i);
  {
    mounted_store m(tmp.dir, 1 << 20);  // 1 MiB buffer: the big file spills
    auto& fs = *m.fs;
    auto d = fs.mknod(root_ino, "run", S_IFDIR | 0755, 0, 0, 0).st_ino;
    auto a = write_file(fs, d, "a.txt", "hello");
    auto b = write_file(fs, d, "big.bin", big);
    CHECK(fs.getattr(b).st_size == off_t(big.size()));  // waits for the commit
    CHECK(read_all(fs, a) == "hello");
    CHECK(read_all(fs, b) == big);
    CHECK(fs.content_of(b).size == big.size());

    // Overwrite of earlier bytes through a second open without O_TRUNC.
    auto h = fs.open(a, O_RDWR).fh;
    fs.write(h, 1, bytes("EL"));
    CHECK(read_all(fs, a) == "hELlo");  // other handles read the buffer while it is written
    fs.release(h);
    CHECK(read_all(fs, a) == "hELlo");

    // Unlinked while open: still readable and writable until the last close.
    h = fs.open(a, O_RDWR).fh;
    fs.lookup(d, "a.txt");
    fs.unlink(d, "a.txt");
    CHECK(errno_of([&] { fs.lookup(d, "a.txt"); }) == ENOENT);
    fs.write(h, 0, bytes("H"));
    std::vector<std::byte> buf(16);
    CHECK(fs.read(h, 0, buf) == 5);
    fs.release(h);
    fs.forget(a, 1);

    fs.link(b, root_ino, "hard");
    fs.rename(d, "big.bin", root_ino, "moved.bin", 0);
    fs.symlink(root_ino, "sl", "moved.bin", 0, 0);
    fs.setxattr(b, "user.k", std::string("v\0w", 3), 0);
    CHECK(fs.getattr(b).st_nlink == 2);
  }
  mounted_store m(tmp.dir);
  auto& fs = *m.fs;
  auto moved = fs.lookup(root_ino, "moved.bin");
  CHECK(moved.st_nlink == 2);
  CHECK(fs.lookup(root_ino, "hard").st_ino == moved.st_ino);
  CHECK(read_all(fs, moved.st_ino) == big);
  CHECK(fs.readlink(fs.lookup(root_ino, "sl").st_ino) == "moved.bin");
  CHECK(fs.getxattr(moved.st_ino, "user.k") == std::string("v\0w", 3));
  auto run = fs.lookup(root_ino, "run").st_ino;
  CHECK(errno_of([&] { fs.lookup(run, "a.txt"); }) == ENOENT);
  CHECK(fs.getxattr(moved.st_ino, filesystem::info_xattr).find("logical_bytes") !=
        std::string::npos);
  CHECK(bf::is_empty(tmp.dir / "staging"));
}

TEST_CASE("filesystem: fsync commits now and truncate of a closed file", "[namespace]") {
  temp_store tmp;
  mounted_store m(tmp.dir);
  auto& fs = *m.fs;
  auto [st, o] = fs.create(root_ino, "f", 0600, O_RDWR | O_CREAT, 0, 0);
  fs.write(o.fh, 0, bytes("0123456789"));
  fs.fsync(o.fh);
  CHECK(fs.content_of(st.st_ino).size == 10);
  fs.write(o.fh, 10, bytes("ab"));  // continues over the committed version
  fs.release(o.fh);
  CHECK(read_all(fs, st.st_ino) == "0123456789ab");
  fs.setattr(st.st_ino, {}, 4, std::nullopt);
  CHECK(read_all(fs, st.st_ino) == "0123");
  fs.setattr(st.st_ino, {}, 6, std::nullopt);
  CHECK(read_all(fs, st.st_ino) == std::string("0123\0\0", 6));
  fs.setattr(st.st_ino, {}, 0, std::nullopt);
  CHECK(read_all(fs, st.st_ino).empty());
  auto h = fs.open(st.st_ino, O_WRONLY | O_TRUNC).fh;
  fs.release(h);
  CHECK(fs.getattr(st.st_ino).st_size == 0);
}

TEST_CASE("filesystem: concurrent writers of different files", "[namespace]") {
  temp_store tmp;
  mounted_store m(tmp.dir, 4 << 20);
  auto& fs = *m.fs;
  std::atomic<int> mismatches{0};  // Catch assertions are not thread-safe
  std::vector<std::jthread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&fs, &mismatches, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 10; ++i) {
        std::string data(rng() % (2 << 20), char('a' + t));
        auto name = "rank" + std::to_string(t) + "_" + std::to_string(i);
        auto ino = write_file(fs, root_ino, name, data);
        if (read_all(fs, ino) != data) ++mismatches;
      }
    });
  threads.clear();
  CHECK(mismatches == 0);
  auto dir = fs.opendir(root_ino);
  CHECK(fs.readdir(dir, 0, 1000).size() == 2 + 40);
  fs.releasedir(dir);
}

namespace {

// A store whose objects live on a 1 MiB tmpfs: committing a file of a few MiB fails with ENOSPC
// (the journal, on the ordinary temporary directory, keeps working). ok() is false where a tmpfs
// cannot be mounted (not root): the test is skipped with a printed reason.
struct full_store {
  full_store() {
    if (small.ok()) m = std::make_unique<mounted_store>(tmp.dir, 64 << 20, small.path());
  }
  bool ok() const { return small.ok(); }
  ckpt::test::tmpfs_mount small{"1m"};
  temp_store tmp;
  std::unique_ptr<mounted_store> m;  // declared last: gone before the tmpfs is unmounted
};

const std::vector<std::byte> too_big = ckpt::test::random_bytes(3 << 20, 7);  // incompressible

}  // namespace

TEST_CASE("filesystem: a failed fsync commit is reported once to every other open handle",
          "[namespace]") {
  full_store s;
  if (!s.ok()) {
    WARN("skipped: " << s.small.reason());
    return;
  }
  auto& fs = *s.m->fs;
  auto [st, w] = fs.create(root_ino, "ckpt.bin", 0644, O_RDWR | O_CREAT, 0, 0);
  const ino_t ino = st.st_ino;
  fs.write(w.fh, 0, too_big);
  auto r = fs.open(ino, O_RDONLY).fh;  // a reader, open while the file is written
  auto f = fs.open(ino, O_RDONLY).fh;  // its fsync stores the writer's buffer, and fails
  CHECK(errno_of([&] { fs.fsync(f); }) == ENOSPC);
  auto late = fs.open(ino, O_RDONLY).fh;  // opened after the failure, which fsync returned

  // The reader's close reports it, once; it does not swallow it: the writer still sees it.
  CHECK(errno_of([&] { fs.flush(r); }) == ENOSPC);
  CHECK(errno_of([&] { fs.flush(r); }) == 0);
  CHECK(errno_of([&] { fs.flush(w.fh); }) == ENOSPC);
  CHECK(errno_of([&] { fs.flush(w.fh); }) == 0);
  // The handle whose fsync returned the failures, and the one opened after: nothing more.
  CHECK(errno_of([&] { fs.flush(f); }) == 0);
  CHECK(errno_of([&] { fs.flush(late); }) == 0);
  for (auto fh : {r, f, late}) fs.release(fh);

  // The writer's data is still buffered: a later fsync that succeeds reports no old failure.
  fs.setattr(ino, {}, 1000, w.fh);  // small enough for the tmpfs now
  CHECK(errno_of([&] { fs.fsync(w.fh); }) == 0);
  CHECK(fs.content_of(ino).size == 1000);
  fs.release(w.fh);
  CHECK(fs.getattr(ino).st_size == 1000);
}

TEST_CASE("filesystem: a failed background commit reaches the writer's reopen past a reader",
          "[namespace]") {
  full_store s;
  if (!s.ok()) {
    WARN("skipped: " << s.small.reason());
    return;
  }
  auto& fs = *s.m->fs;
  auto [st, w] = fs.create(root_ino, "ckpt.bin", 0644, O_WRONLY | O_CREAT, 0, 0);
  const ino_t ino = st.st_ino;
  fs.write(w.fh, 0, too_big);
  auto r = fs.open(ino, O_RDONLY).fh;  // a reader, open across the commit
  CHECK(errno_of([&] { fs.flush(w.fh); }) == 0);
  fs.release(w.fh);                     // stored on a worker: fails
  CHECK(fs.getattr(ino).st_size == 0);  // waits for the commit; the old content stays

  // The reader was open when it failed: its close reports it, once.
  CHECK(errno_of([&] { fs.flush(r); }) == ENOSPC);
  CHECK(errno_of([&] { fs.flush(r); }) == 0);
  fs.release(r);

  // The kernel forgets the inode: the failure is still unclaimed, so its state stays.
  fs.forget(ino, 1);
  CHECK(fs.lookup(root_ino, "ckpt.bin").st_ino == ino);

  // The writer reopens the file to make sure it is stored: the reader did not swallow the
  // failure, this handle reports it (once) and claims it.
  auto again = fs.open(ino, O_RDONLY).fh;
  auto both = fs.open(ino, O_RDONLY).fh;  // also opened before anyone claimed it
  CHECK(errno_of([&] { fs.fsync(again); }) == ENOSPC);
  CHECK(errno_of([&] { fs.fsync(again); }) == 0);
  CHECK(errno_of([&] { fs.flush(again); }) == 0);
  CHECK(errno_of([&] { fs.flush(both); }) == ENOSPC);
  CHECK(errno_of([&] { fs.flush(both); }) == 0);

  // Opened after it was claimed: an old failure is not reported.
  auto after = fs.open(ino, O_RDONLY).fh;
  CHECK(errno_of([&] { fs.flush(after); }) == 0);
  CHECK(errno_of([&] { fs.fsync(after); }) == 0);
  for (auto fh : {again, both, after}) fs.release(fh);

  // Claimed and forgotten (the state may go): the file is written again, and its writer's
  // close reports nothing old.
  fs.forget(ino, 1);
  CHECK(fs.lookup(root_ino, "ckpt.bin").st_ino == ino);
  auto w2 = fs.open(ino, O_WRONLY | O_TRUNC).fh;
  fs.write(w2, 0, bytes("small"));
  CHECK(errno_of([&] { fs.flush(w2); }) == 0);
  fs.release(w2);
  CHECK(read_all(fs, ino) == "small");
}
