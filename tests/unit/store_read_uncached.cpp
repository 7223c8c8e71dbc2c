// object_store::read_uncached (frames read with O_DIRECT where not cached) and page_buffer.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "codec/error.hpp"
#include "fs/store/object_store.hpp"
#include "fs/store/page_buffer.hpp"
#include "store_test_util.hpp"

using namespace ckpt;
using namespace ckpt::store;
using ckpt::test::random_bytes;

namespace {

// Drops the object's clean pages from the page cache, so that the next read goes to the disk
// (O_DIRECT) instead of copying cached pages.
void evict(const boost::filesystem::path& dir, object_id id) {
  char name[32];
  std::snprintf(name, sizeof name, "%016" PRIx64 ".obj", id);
  const int fd = ::open((dir / name).c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

}  // namespace

TEST_CASE("page_buffer: aligned, sized, movable", "[store][page_buffer]") {
  for (std::size_t n : {std::size_t(1), std::size_t(4097), std::size_t(1) << 20,
                        std::size_t(4) << 20, (std::size_t(4) << 20) * 3 + 5}) {
    page_buffer b(n);
    REQUIRE(b.size() == n);
    REQUIRE(reinterpret_cast<std::uintptr_t>(b.data()) % 4096 == 0);
    std::memset(b.data(), 0x5a, n);  // every byte is writable
    page_buffer moved(std::move(b));
    CHECK(b.size() == 0);
    CHECK(b.data() == nullptr);
    CHECK(moved.size() == n);
    CHECK(std::to_integer<int>(moved.data()[n - 1]) == 0x5a);
    moved = page_buffer();
    CHECK(moved.size() == 0);
  }
  CHECK(page_buffer(0).data() == nullptr);
}

TEST_CASE("objects: read_uncached returns read()'s bytes, cached or not", "[store]") {
  test::temp_dir dir;
  object_store s(dir.path());
  const auto data = random_bytes((std::size_t(9) << 20) + 4321, 7);
  const std::span<const std::byte> pieces[] = {data};
  const object_ref r = s.put(pieces);

  page_buffer scratch;
  const std::pair<std::uint64_t, std::size_t> ranges[] = {{0, data.size()},
                                                          {1, 1},
                                                          {4064, 64},
                                                          {4095, 8193},
                                                          {12345, std::size_t(5) << 20},
                                                          {data.size() - 1, 1},
                                                          {data.size() - 100000, 100000},
                                                          {8, 0}};
  for (bool cold : {false, true}) {
    for (auto [off, len] : ranges) {
      if (cold) evict(dir.path(), r.id);
      const auto got = s.read_uncached(r.id, off, len, scratch);
      REQUIRE(got.size() == len);
      CHECK(std::memcmp(got.data(), data.data() + off, len) == 0);
    }
  }
  // Half cached: the cached front is copied, the rest read around the cache.
  evict(dir.path(), r.id);
  std::vector<std::byte> front(std::size_t(3) << 20);
  s.read(r.id, 0, front);
  const auto got = s.read_uncached(r.id, 1000, data.size() - 1000, scratch);
  CHECK(std::memcmp(got.data(), data.data() + 1000, got.size()) == 0);

  CHECK_THROWS_AS(s.read_uncached(r.id, data.size() - 10, 11, scratch), corrupt_error);
  CHECK_THROWS_AS(s.read_uncached(r.id + 1, 0, 1, scratch), corrupt_error);
}
