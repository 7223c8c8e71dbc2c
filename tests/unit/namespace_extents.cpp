// fs::filesystem on ordinary files as extents: the size limit (EFBIG), sparse files whose holes
// cost nothing and are reported by SEEK_DATA/SEEK_HOLE, fallocate's modes, and partial rewrites
// of a large file that store about the chunks they touch (reusing the previous version's blocks)
// without leaking the versions they reuse. Each checked through a restart too.
#include <fcntl.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <thread>

#include "namespace_test_util.hpp"

using namespace ckpt::fs;
using namespace ckpt::test;

namespace {

constexpr std::uint64_t MiB = 1 << 20;

std::string random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = char(rng());
  return s;
}

void pwrite_file(filesystem& fs, ino_t ino, std::uint64_t off, const std::string& data) {
  auto h = fs.open(ino, O_RDWR).fh;
  fs.write(h, off, bytes(data));
  fs.release(h);
}

std::uint64_t stored(mounted_store& m, ino_t ino) {
  return m.content.info(m.fs->content_of(ino)).stored_bytes;
}

}  // namespace

TEST_CASE("filesystem: sizes past the limit fail with EFBIG at once", "[namespace]") {
  temp_store tmp;
  mounted_store m(tmp.dir);
  auto& fs = *m.fs;
  auto [st, o] = fs.create(root_ino, "f", 0644, O_RDWR | O_CREAT, 0, 0);
  CHECK(errno_of([&] { fs.setattr(st.st_ino, {}, 999999999999999ull, o.fh); }) == EFBIG);
  CHECK(errno_of([&] { fs.write(o.fh, filesystem::max_file_size - 2, bytes("abc")); }) == EFBIG);
  CHECK(errno_of([&] { fs.fallocate(o.fh, 0, filesystem::max_file_size, 1); }) == EFBIG);
  // Up to the limit is fine, and costs nothing.
  fs.setattr(st.st_ino, {}, filesystem::max_file_size, o.fh);
  CHECK(fs.getattr(st.st_ino).st_size == off_t(filesystem::max_file_size));
  fs.release(o.fh);
  CHECK(fs.content_of(st.st_ino).size == filesystem::max_file_size);
  CHECK(stored(m, st.st_ino) < MiB);
  CHECK(fs.getattr(st.st_ino).st_blksize == filesystem::block_size);
}

TEST_CASE("filesystem: a sparse file stores its data only and reports its holes", "[namespace]") {
  temp_store tmp;
  ino_t ino = 0;
  const std::uint64_t at = 5ull << 30, size = 10ull << 30;
  {
    mounted_store m(tmp.dir);
    auto& fs = *m.fs;
    auto [st, o] = fs.create(root_ino, "sparse", 0644, O_RDWR | O_CREAT, 0, 0);
    ino = st.st_ino;
    fs.write(o.fh, at, bytes(std::string(4096, 'x')));
    fs.setattr(ino, {}, size, o.fh);
    // While open: holes from the write buffer.
    CHECK(fs.lseek(o.fh, 0, SEEK_DATA) == at);
    CHECK(fs.lseek(o.fh, 0, SEEK_HOLE) == 0);
    CHECK(fs.lseek(o.fh, at, SEEK_HOLE) == at + MiB);
    CHECK(errno_of([&] { fs.lseek(o.fh, at + MiB, SEEK_DATA); }) == ENXIO);
    CHECK(errno_of([&] { fs.lseek(o.fh, size, SEEK_HOLE); }) == ENXIO);
    fs.release(o.fh);
    CHECK(stored(m, ino) < MiB);
    CHECK(fs.getattr(ino).st_blocks * 512 < std::int64_t(MiB));
  }
  mounted_store m(tmp.dir);  // after a restart: holes from the stored regions
  auto& fs = *m.fs;
  auto h = fs.open(ino, O_RDONLY).fh;
  CHECK(fs.lseek(h, 0, SEEK_DATA) == at);
  CHECK(fs.lseek(h, at + 10, SEEK_DATA) == at + 10);
  CHECK(fs.lseek(h, at, SEEK_HOLE) >= at + 4096);
  CHECK(fs.lseek(h, at, SEEK_HOLE) <= at + MiB);
  CHECK(fs.lseek(h, size - 1, SEEK_HOLE) == size - 1);
  std::vector<std::byte> out(8192);
  CHECK(fs.read(h, at - 4096, out) == 8192);
  CHECK(out[4095] == std::byte{0});
  CHECK(out[4096] == std::byte{'x'});
  CHECK(out[8191] == std::byte{'x'});
  CHECK(fs.read(h, size - 100, out) == 100);
  fs.release(h);
}

TEST_CASE("filesystem: one read crosses data, a hole and data again", "[namespace]") {
  temp_store tmp;
  std::string model(5 * MiB, '\0');
  ino_t ino = 0;
  {
    mounted_store m(tmp.dir);
    auto& fs = *m.fs;
    auto [st, o] = fs.create(root_ino, "f", 0644, O_RDWR | O_CREAT, 0, 0);
    ino = st.st_ino;
    const std::string a = random_bytes(MiB + 5000, 7), b = random_bytes(4000, 8);
    fs.write(o.fh, 0, bytes(a));
    fs.write(o.fh, 4 * MiB + 100, bytes(b));
    fs.setattr(ino, {}, 5 * MiB, o.fh);
    fs.release(o.fh);
    model.replace(0, a.size(), a);
    model.replace(4 * MiB + 100, b.size(), b);
  }
  mounted_store m(tmp.dir);  // the regions with their holes, read cold
  auto& fs = *m.fs;
  auto h = fs.open(ino, O_RDONLY).fh;
  std::vector<std::byte> out(5 * MiB);
  REQUIRE(fs.read(h, 0, out) == out.size());
  CHECK(std::memcmp(out.data(), model.data(), model.size()) == 0);
  std::vector<std::byte> part(3 * MiB);
  REQUIRE(fs.read(h, MiB + 1000, part) == part.size());  // data, hole, data
  CHECK(std::memcmp(part.data(), model.data() + MiB + 1000, part.size()) == 0);
  fs.release(h);
}

TEST_CASE("filesystem: fallocate modes", "[namespace]") {
  temp_store tmp;
  mounted_store m(tmp.dir);
  auto& fs = *m.fs;
  const std::string data = random_bytes(3 * MiB, 1);
  const ino_t ino = write_file(fs, root_ino, "f", data);
  auto h = fs.open(ino, O_RDWR).fh;
  fs.fallocate(h, 0, 0, 2 * MiB);  // inside: nothing changes
  CHECK(fs.getattr(ino).st_size == off_t(3 * MiB));
  fs.fallocate(h, FALLOC_FL_KEEP_SIZE, 0, 8 * MiB);
  CHECK(fs.getattr(ino).st_size == off_t(3 * MiB));
  fs.fallocate(h, 0, 2 * MiB, 3 * MiB);  // extends to 5 MiB with zeros
  CHECK(fs.getattr(ino).st_size == off_t(5 * MiB));
  fs.fallocate(h, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100, MiB + 200);
  fs.fallocate(h, FALLOC_FL_ZERO_RANGE, 5 * MiB - 10, 20);  // zeros and extends by 10
  CHECK(errno_of([&] { fs.fallocate(h, FALLOC_FL_PUNCH_HOLE, 0, 10); }) == EOPNOTSUPP);
  CHECK(errno_of([&] { fs.fallocate(h, FALLOC_FL_COLLAPSE_RANGE, 0, MiB); }) == EOPNOTSUPP);
  CHECK(errno_of([&] { fs.fallocate(h, 0, 0, 1ull << 43); }) == ENOSPC);  // 8 TiB: no room
  fs.release(h);
  auto r = fs.open(ino, O_RDONLY).fh;
  CHECK(errno_of([&] { fs.fallocate(r, 0, 0, 10); }) == EBADF);
  fs.release(r);
  std::string want = data;
  want.resize(5 * MiB + 10, '\0');
  std::fill(want.begin() + 100, want.begin() + 100 + MiB + 200, '\0');
  CHECK(read_all(fs, ino) == want);
}

TEST_CASE("filesystem: small rewrites of a large file store the chunks they touch", "[namespace]") {
  temp_store tmp;
  std::string model = random_bytes(32 * MiB, 2);
  ino_t ino = 0;
  {
    mounted_store m(tmp.dir);
    auto& fs = *m.fs;
    ino = write_file(fs, root_ino, "data.bin", model);
    const std::uint64_t first = stored(m, ino);
    CHECK(first > 30 * MiB);  // random bytes do not compress
    std::mt19937_64 rng(3);
    for (int i = 0; i < 12; ++i) {
      const std::uint64_t off = rng() % (model.size() - 4096);
      const std::string patch = random_bytes(4096, 100 + i);
      pwrite_file(fs, ino, off, patch);
      model.replace(off, patch.size(), patch);
      // At most the two chunks the write touched (plus metadata).
      CHECK(stored(m, ino) < 2 * MiB + 64 * 1024);
    }
    CHECK(read_all(fs, ino) == model);
    // The versions it reused are hidden donors now: the original (all but 12 chunks of it in
    // use) and the small ones whose chunks were not overwritten again.
    const auto vs = m.content.versions();
    CHECK(vs.size() <= 13);
    std::uint64_t total = 0;
    for (const auto& v : vs) total += v.stored_bytes;
    CHECK(total < 33 * MiB + 12 * (MiB + 64 * 1024));
    // An append and a truncate cost what they touch too.
    pwrite_file(fs, ino, model.size(), "tail");
    model += "tail";
    CHECK(stored(m, ino) < 2 * MiB);
    CHECK(read_all(fs, ino) == model);
  }
  {
    mounted_store m(tmp.dir);  // a restart: donors found again from the journal
    auto& fs = *m.fs;
    CHECK(read_all(fs, ino) == model);
    auto h = fs.open(ino, O_RDONLY).fh;
    fs.release(h);
    CHECK(m.content.verify(fs.content_of(ino).version, true).empty());
    // Rewriting most of the file: the old blocks are no longer worth keeping (fewer than half of
    // the original's) and are encoded again, so the old versions can go.
    const std::string most = random_bytes(20 * MiB, 4);
    pwrite_file(fs, ino, 0, most);
    model.replace(0, most.size(), most);
    CHECK(read_all(fs, ino) == model);
    fs.sync();
    // What is left: the new version and the small donors whose chunks it still uses; the
    // original went (under half of it was still in use), and with it what only it needed.
    std::uint64_t total = 0;
    for (const auto& v : m.content.versions()) {
      total += v.stored_bytes;
      if (v.refs == 0) CHECK(v.stored_bytes < 2 * MiB);
    }
    CHECK(total < 34 * MiB + 64 * 1024);
  }
  mounted_store m(tmp.dir);
  auto& fs = *m.fs;
  CHECK(read_all(fs, ino) == model);
  fs.unlink(root_ino, "data.bin");
  fs.sync();
  CHECK(m.content.versions().empty());  // no donor leaked
}

TEST_CASE("filesystem: hidden donors keep their state through a journal compaction",
          "[namespace]") {
  temp_store tmp;
  std::string model = random_bytes(4 * MiB, 21);
  ino_t ino = 0;
  {
    mounted_store m(tmp.dir);
    auto& fs = *m.fs;
    ino = write_file(fs, root_ino, "data.bin", model);
    // v2 reuses v1's chunks; v3 and v4 rewrite around v2's own chunk, so that v2 (and v1, which
    // v2's other chunks came from) are hidden donors whose own donors were released.
    auto patch = [&](std::uint64_t off, const std::string& b) {
      pwrite_file(fs, ino, off, b);
      model.replace(off, b.size(), b);
    };
    patch(MiB + 5, "hello");
    patch(0, random_bytes(MiB, 22));
    patch(2 * MiB, random_bytes(2 * MiB, 23));
    fs.sync();
    for (const auto& v : m.content.versions()) CHECK(m.content.verify(v.version, true).empty());
    bool compacted = false;  // refused while a commit is between its records: try again
    for (int i = 0; i < 200 && !compacted; ++i) {
      compacted = fs.compact();
      if (!compacted) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE(compacted);
  }
  mounted_store m(tmp.dir);
  CHECK(read_all(*m.fs, ino) == model);
  std::size_t hidden = 0;
  for (const auto& v : m.content.versions()) {
    hidden += v.refs == 0;
    INFO("version " << v.version);
    CHECK(m.content.verify(v.version, true).empty());
  }
  CHECK(hidden > 0);  // the case this is about: versions kept only for their blocks
}
