// object_store::read_uncached (frames read with O_DIRECT where not cached) and page_buffer.
#include <fcntl.h>
#include <sys/mman.h>
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

// Pages of the object's file that the page cache holds (mincore over a shared mapping).
std::size_t resident_pages(const boost::filesystem::path& dir, object_id id) {
  char name[32];
  std::snprintf(name, sizeof name, "%016" PRIx64 ".obj", id);
  const int fd = ::open((dir / name).c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  const auto size = std::size_t(::lseek(fd, 0, SEEK_END));
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  REQUIRE(map != MAP_FAILED);
  std::vector<unsigned char> in((size + 4095) / 4096);
  REQUIRE(::mincore(map, size, in.data()) == 0);
  ::munmap(map, size);
  std::size_t n = 0;
  for (auto c : in) n += c & 1;
  return n;
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
  // Half cached: read whole with O_DIRECT, which is coherent with the cached front.
  evict(dir.path(), r.id);
  std::vector<std::byte> front(std::size_t(3) << 20);
  s.read(r.id, 0, front);
  const auto got = s.read_uncached(r.id, 1000, data.size() - 1000, scratch);
  CHECK(std::memcmp(got.data(), data.data() + 1000, got.size()) == 0);

  CHECK_THROWS_AS(s.read_uncached(r.id, data.size() - 10, 11, scratch), corrupt_error);
  CHECK_THROWS_AS(s.read_uncached(r.id + 1, 0, 1, scratch), corrupt_error);
}

// The point of read_uncached: a cold frame goes from the disk into the caller's buffer once.
// Probing the page cache with a RWF_NOWAIT read started readahead into it before failing, so
// the frame was read twice and the daemon paid for page-cache pages nobody used again.
TEST_CASE("objects: a cold read_uncached leaves the page cache empty", "[store]") {
  test::temp_dir dir;
  object_store s(dir.path());
  const auto data = random_bytes(std::size_t(16) << 20, 11);
  const std::span<const std::byte> pieces[] = {data};
  const object_ref r = s.put(pieces);
  evict(dir.path(), r.id);
  if (resident_pages(dir.path(), r.id) > 0) {
    WARN("skipped: the test directory's filesystem keeps pages POSIX_FADV_DONTNEED drops (tmpfs)");
    return;
  }
  page_buffer scratch;
  for (std::size_t off = 0; off < data.size(); off += std::size_t(4) << 20) {
    const auto got = s.read_uncached(r.id, off, std::size_t(4) << 20, scratch);
    REQUIRE(std::memcmp(got.data(), data.data() + off, got.size()) == 0);
  }
  // The object's framing (header, footer) is read through the cache: a few pages at its ends.
  CHECK(resident_pages(dir.path(), r.id) < 128);
}

// A cold chain's metadata is read object after object; prefetch asks the disk for all of them
// first (posix_fadvise WILLNEED): small objects whole, large ones their ends.
TEST_CASE("objects: prefetch brings small objects whole and large ones' ends into the page cache",
          "[store]") {
  test::temp_dir dir;
  object_store s(dir.path());
  const auto small = random_bytes(std::size_t(200) << 10, 12);
  const auto large = random_bytes(std::size_t(24) << 20, 13);
  const std::span<const std::byte> small_pieces[] = {small}, large_pieces[] = {large};
  const object_ref a = s.put(small_pieces), b = s.put(small_pieces), c = s.put(large_pieces);
  for (const auto& r : {a, b, c}) evict(dir.path(), r.id);
  if (resident_pages(dir.path(), a.id) > 0) {
    WARN("skipped: the test directory's filesystem keeps pages POSIX_FADV_DONTNEED drops (tmpfs)");
    return;
  }
  const object_id ids[] = {a.id, 999'999, b.id, c.id};  // a missing one is skipped
  s.prefetch(ids, std::uint64_t(1) << 20);
  // WILLNEED starts the reads and returns; wait for them (a few ms on a disk).
  const std::size_t small_pages = (small.size() + 4095) / 4096;
  for (int i = 0; i < 200 && (resident_pages(dir.path(), a.id) < small_pages ||
                              resident_pages(dir.path(), b.id) < small_pages ||
                              resident_pages(dir.path(), c.id) < 256);
       ++i)
    ::usleep(10'000);
  CHECK(resident_pages(dir.path(), a.id) >= small_pages);
  CHECK(resident_pages(dir.path(), b.id) >= small_pages);
  const std::size_t large_resident = resident_pages(dir.path(), c.id);
  CHECK(large_resident >= 256);                                // its last MiB
  CHECK(large_resident < (std::size_t(24) << 20) / 4096 / 2);  // not the whole object
  // Reads return the same bytes as ever.
  std::vector<std::byte> out(small.size());
  s.read(a.id, 0, out);
  CHECK(out == small);
}
