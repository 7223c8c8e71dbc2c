// Streaming object writer (object_store::begin, fs/store/object_writer.cpp): appends of any size
// across its 4 MiB O_DIRECT buffers give the same object as put() of the concatenation; a writer
// that is dropped or fails leaves nothing behind; ENOSPC in the middle of a stream fails cleanly.
#include <catch2/catch.hpp>
#include <random>

#include "codec/error.hpp"
#include "fs/store/object_store.hpp"
#include "store_test_util.hpp"

using namespace ckpt;
using namespace ckpt::store;
using ckpt::test::random_bytes;

namespace {

std::size_t count_files(const boost::filesystem::path& dir, const std::string& ext) {
  std::size_t n = 0;
  for (auto& e : boost::filesystem::directory_iterator(dir))
    if (e.path().extension() == ext) ++n;
  return n;
}

}  // namespace

TEST_CASE("object writer: appends of every size across buffer boundaries round-trip",
          "[store][writer]") {
  test::temp_dir tmp;  // a real disk (the O_DIRECT path), not tmpfs
  object_store s(tmp.path() / "objects");
  const auto data = random_bytes((21u << 20) + 12345, 7);
  std::mt19937 rng(3);
  // Piece sizes from 0 bytes to 9 MiB: inside one buffer, exactly filling it, spanning two.
  std::vector<std::size_t> cuts;
  for (std::size_t at = 0; at < data.size();) {
    const std::size_t n =
        std::min<std::size_t>(data.size() - at, rng() % 3 == 0 ? rng() % (9u << 20) : rng() % 5000);
    cuts.push_back(n);
    at += n;
  }
  object_writer w = s.begin();
  std::vector<std::byte> reused;
  std::size_t at = 0;
  for (auto n : cuts) {
    // The writer copies: the caller's buffer is overwritten right after each append.
    reused.assign(data.begin() + long(at), data.begin() + long(at + n));
    w.append(reused);
    std::fill(reused.begin(), reused.end(), std::byte{0xee});
    at += n;
    CHECK(w.size() == at);
  }
  CHECK(w.buffer_bytes_held() == (8u << 20));  // two 4 MiB buffers while written
  const object_ref r = w.commit();
  CHECK(w.buffer_bytes_held() == 0);  // gone at the commit, though the writer lives on
  CHECK(r.size == data.size());
  std::vector<std::byte> back(data.size());
  s.read(r.id, 0, back);
  CHECK(back == data);
  s.verify(r);
  // The same bytes through put() have the same checksum.
  std::span<const std::byte> one[] = {data};
  CHECK(s.put(one).checksum == r.checksum);
  CHECK(count_files(tmp.path() / "objects", ".tmp") == 0);
}

TEST_CASE("object writer: small and empty objects", "[store][writer]") {
  test::temp_dir tmp;
  object_store s(tmp.path() / "objects");
  object_writer e = s.begin();
  const object_ref re = e.commit();
  CHECK(re.size == 0);
  s.verify(re);
  const auto d = random_bytes(100, 1);
  object_writer w = s.begin();
  w.append(d);
  const object_ref r = w.commit();
  std::vector<std::byte> back(100);
  s.read(r.id, 0, back);
  CHECK(back == d);
  CHECK_THROWS_AS(w.append(d), io_error);  // committed writers take nothing more
}

TEST_CASE("object writer: a writer dropped before commit leaves no file, ids move on",
          "[store][writer]") {
  test::temp_dir tmp;
  const auto dir = tmp.path() / "objects";
  object_store s(dir);
  object_id dropped = 0;
  {
    object_writer w = s.begin();
    w.append(random_bytes(6u << 20, 2));  // one buffer already written
    CHECK(count_files(dir, ".tmp") == 1);
    dropped = s.list().empty() ? 0 : 1;
  }
  CHECK(dropped == 0);
  CHECK(count_files(dir, ".tmp") == 0);
  CHECK(s.list().empty());
  object_writer w = s.begin();
  w.append(random_bytes(10, 3));
  CHECK(w.commit().id >= 2);
}

TEST_CASE("object writer: ENOSPC in the middle of a stream fails cleanly", "[store][writer]") {
  test::tmpfs_mount fs("8m");
  if (!fs.ok()) {
    WARN("skipped: " << fs.reason());
    return;
  }
  const auto dir = fs.path() / "objects";
  object_store s(dir);
  const auto small = random_bytes(100000, 4);
  std::span<const std::byte> one[] = {small};
  const object_ref kept = s.put(one);
  int err = 0;
  try {
    object_writer w = s.begin();
    const auto chunk = random_bytes(1u << 20, 5);
    for (int i = 0; i < 16; ++i) w.append(chunk);
    w.commit();
  } catch (const io_error& e) {
    err = e.sys_errno();
  }
  CHECK(err == ENOSPC);
  CHECK(count_files(dir, ".tmp") == 0);
  CHECK(s.list() == std::vector<object_id>{kept.id});
  s.verify(kept);
  // Usable again once there is room.
  const object_ref again = s.put(one);
  s.verify(again);
}
