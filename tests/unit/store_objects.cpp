// Object store (fs/store/object_store.hpp): round trips through the io_uring writer, concurrent
// puts, id continuity, corruption detection (bit flips, truncation, damaged framing, missing
// objects) and ENOSPC on a tiny tmpfs (no object left behind, earlier objects intact).
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cinttypes>
#include <cstdio>
#include <set>
#include <thread>

#include "codec/error.hpp"
#include "fs/store/object_store.hpp"
#include "fs/store/uring.hpp"
#include "store_test_util.hpp"

using namespace ckpt;
using namespace ckpt::store;
using ckpt::test::random_bytes;

namespace {

boost::filesystem::path obj_path(const boost::filesystem::path& dir, object_id id) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016" PRIx64 ".obj", id);
  return dir / buf;
}

object_ref put_one(object_store& s, std::span<const std::byte> data) {
  std::span<const std::byte> pieces[] = {data};
  return s.put(pieces);
}

std::vector<std::byte> read_all(const object_store& s, const object_ref& r) {
  std::vector<std::byte> out(r.size);
  s.read(r.id, 0, out);
  return out;
}

std::size_t count_tmp_files(const boost::filesystem::path& dir) {
  std::size_t n = 0;
  for (auto& e : boost::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".tmp") ++n;
  return n;
}

}  // namespace

TEST_CASE("objects: put/read round trips (empty, small, multi-piece, 100 MB)", "[store]") {
  test::temp_dir tmp;
  object_store s(tmp.path() / "objects");

  SECTION("empty") {
    auto r = s.put({});
    CHECK(r.size == 0);
    CHECK(r.id >= 1);
    std::vector<std::byte> none;
    s.read(r.id, 0, none);
    s.verify(r);
    CHECK(s.disk_bytes(r.id) == 64);  // framing only
    std::span<const std::byte> empty_pieces[] = {{}, {}};
    auto r2 = s.put(empty_pieces);
    CHECK(r2.size == 0);
    CHECK(r2.checksum == r.checksum);
  }
  SECTION("small and multi-piece, partial reads") {
    auto a = random_bytes(1, 1), b = random_bytes(4095, 2), c = random_bytes(70000, 3);
    auto r1 = put_one(s, a);
    CHECK(read_all(s, r1) == a);
    std::span<const std::byte> pieces[] = {a, {}, b, c, a};
    auto r2 = s.put(pieces);
    std::vector<std::byte> cat;
    for (auto p : pieces) cat.insert(cat.end(), p.begin(), p.end());
    REQUIRE(r2.size == cat.size());
    CHECK(read_all(s, r2) == cat);
    CHECK(r2.id > r1.id);
    s.verify(r2);
    std::vector<std::byte> part(1000);
    s.read(r2.id, 3000, part);
    CHECK(std::equal(part.begin(), part.end(), cat.begin() + 3000));
    CHECK(s.disk_bytes(r2.id) == cat.size() + 64);
    // Reads past the payload are refused, not padded.
    std::vector<std::byte> past(10);
    CHECK_THROWS_AS(s.read(r2.id, cat.size() - 5, past), corrupt_error);
  }
  SECTION("100 MB in many pieces (several SQEs, iovec batching)") {
    auto big = random_bytes(100u << 20, 4);
    std::vector<std::span<const std::byte>> pieces;
    std::size_t off = 0, step = 1;
    while (off < big.size()) {  // pieces from 1 byte to ~8 MiB
      std::size_t n = std::min(step, big.size() - off);
      pieces.push_back(std::span(big).subspan(off, n));
      off += n;
      step = step * 3 + 1;
    }
    auto r = s.put(pieces);
    REQUIRE(r.size == big.size());
    CHECK(read_all(s, r) == big);
    s.verify(r);
  }
}

TEST_CASE("objects: concurrent puts from 4 threads", "[store]") {
  test::temp_dir tmp;
  object_store s(tmp.path() / "objects");
  constexpr int threads = 4, per_thread = 25;
  std::vector<std::vector<std::pair<object_ref, std::vector<std::byte>>>> done(threads);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        auto data = random_bytes(1000 + static_cast<std::size_t>(t * 7919 + i * 104729) % 300000,
                                 static_cast<std::uint64_t>(t * 1000 + i));
        done[t].emplace_back(put_one(s, data), std::move(data));
      }
    });
  }
  for (auto& t : ts) t.join();
  std::set<object_id> ids;
  for (auto& v : done)
    for (auto& [ref, data] : v) {
      ids.insert(ref.id);
      CHECK(read_all(s, ref) == data);
      s.verify(ref);
    }
  CHECK(ids.size() == threads * per_thread);
  CHECK(s.list() == std::vector<object_id>(ids.begin(), ids.end()));
}

TEST_CASE("objects: ids continue after reopen, remove and list", "[store]") {
  test::temp_dir tmp;
  const auto dir = tmp.path() / "objects";
  std::vector<object_id> ids;
  {
    object_store s(dir);
    for (int i = 0; i < 5; ++i) ids.push_back(put_one(s, random_bytes(100, i)).id);
    CHECK(s.list() == ids);
    s.remove(ids[1]);
    s.remove(ids[1]);  // missing is not an error
    s.remove(12345);
    CHECK(s.disk_bytes(ids[1]) == 0);
    CHECK_THROWS_AS(read_all(s, {ids[1], 100, 0}), corrupt_error);
    ids.erase(ids.begin() + 1);
    CHECK(s.list() == ids);
  }
  {
    object_store s(dir);
    CHECK(s.list() == ids);
    auto r = put_one(s, random_bytes(10, 99));
    CHECK(r.id > ids.back());
    s.remove(r.id);
    s.remove(ids.back());
  }
  {
    // Ids continue after the largest id *present* (the contract): removed ids above it may
    // be reused, those below never are.
    object_store s(dir);
    auto r = put_one(s, random_bytes(10, 98));
    CHECK(r.id > ids[ids.size() - 2]);
  }
  {
    // A leftover .tmp from a crashed put is removed at open and its id is not reused.
    boost::filesystem::path stale = obj_path(dir, 0x100);
    stale += ".tmp";
    {
      std::FILE* f = std::fopen(stale.c_str(), "w");
      std::fputs("torn", f);
      std::fclose(f);
    }
    object_store s(dir);
    CHECK_FALSE(boost::filesystem::exists(stale));
    CHECK(put_one(s, random_bytes(10, 97)).id == 0x101);
    for (auto id : s.list()) CHECK(id != 0x100);
  }
}

TEST_CASE("objects: verify and read detect damage", "[store]") {
  test::temp_dir tmp;
  const auto dir = tmp.path() / "objects";
  object_store s(dir);
  auto data = random_bytes(50000, 5);
  auto fresh = [&] {
    auto r = put_one(s, data);
    return std::pair{r, obj_path(dir, r.id)};
  };

  SECTION("flipped payload bit: verify throws") {
    auto [r, file] = fresh();
    s.verify(r);
    test::flip_bit(file, 32 + 12345, 3);
    CHECK_THROWS_AS(s.verify(r), corrupt_error);
  }
  SECTION("a reference that does not match the object") {
    auto [r, file] = fresh();
    CHECK_THROWS_AS(s.verify({r.id, r.size, r.checksum ^ 1}), corrupt_error);
    CHECK_THROWS_AS(s.verify({r.id, r.size + 1, r.checksum}), corrupt_error);
  }
  SECTION("truncated object") {
    auto [r, file] = fresh();
    for (std::uint64_t keep :
         {std::uint64_t{0}, std::uint64_t{10}, std::uint64_t{40}, r.size + 63, r.size / 2}) {
      test::truncate_file(file, keep);
      CHECK_THROWS_AS(read_all(s, r), corrupt_error);
      CHECK_THROWS_AS(s.verify(r), corrupt_error);
    }
  }
  SECTION("missing object") {
    auto [r, file] = fresh();
    boost::filesystem::remove(file);
    CHECK_THROWS_AS(read_all(s, r), corrupt_error);
    CHECK_THROWS_AS(s.verify(r), corrupt_error);
  }
  SECTION("damaged footer or header: every byte of the framing") {
    auto [r, file] = fresh();
    const std::uint64_t total = r.size + 64;
    for (std::uint64_t i = 0; i < 64; ++i) {
      const std::uint64_t at = i < 32 ? i : total - 64 + i;
      test::flip_bit(file, at, static_cast<int>(i % 8));
      CHECK_THROWS_AS(read_all(s, r), corrupt_error);
      test::flip_bit(file, at, static_cast<int>(i % 8));
    }
    CHECK(read_all(s, r) == data);
    test::flip_bit(file, total - 1);  // the footer magic
    CHECK_THROWS_AS(read_all(s, r), corrupt_error);
  }
}

TEST_CASE("objects: ENOSPC fails the put cleanly and keeps earlier objects", "[store]") {
  test::tmpfs_mount fs("1m");
  if (!fs.ok()) {
    WARN("skipped: " << fs.reason());
    return;
  }
  const auto dir = fs.path() / "objects";
  object_store s(dir);
  std::vector<std::pair<object_ref, std::vector<std::byte>>> kept;
  for (int i = 0; i < 3; ++i) {
    auto d = random_bytes(100000, 10 + i);
    kept.emplace_back(put_one(s, d), std::move(d));
  }
  auto big = random_bytes(2u << 20, 20);
  int err = 0;
  try {
    put_one(s, big);
  } catch (const io_error& e) {
    err = e.sys_errno();
    INFO(e.what());
  }
  CHECK(err == ENOSPC);
  CHECK(count_tmp_files(dir) == 0);
  CHECK(s.list().size() == kept.size());
  for (auto& [r, d] : kept) {
    CHECK(read_all(s, r) == d);
    s.verify(r);
  }
  // The store stays usable once there is room (the failed put's ring is reused).
  auto small = random_bytes(1000, 21);
  auto r = put_one(s, small);
  CHECK(read_all(s, r) == small);
}

TEST_CASE("objects: a forked child gets its own ring (the parent's is shared memory)", "[store]") {
  test::temp_dir tmp;
  object_store s(tmp.path() / "objects");
  auto a = random_bytes(5000, 30);
  auto ra = put_one(s, a);  // this thread now has a ring
  if (!ckpt::store::detail::uring_available())
    WARN("io_uring unavailable here: puts use the pwritev fallback");
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = 1;
    try {
      auto b = random_bytes(7000, 31);
      auto rb = put_one(s, b);
      rc = read_all(s, rb) == b ? 0 : 2;
    } catch (...) {
    }
    ::_exit(rc);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  auto c = random_bytes(9000, 32);
  auto rc = put_one(s, c);  // the parent's ring still works
  CHECK(read_all(s, rc) == c);
  CHECK(read_all(s, ra) == a);
  CHECK(s.list().size() == 3);
}
