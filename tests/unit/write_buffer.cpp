// fs/namespace/write_buffer: writes at any offset, holes, truncate and a spill to the staging
// file half-way, checked against a plain byte vector; the streaming gate (waits, stale reads).
#include <algorithm>
#include <atomic>
#include <boost/filesystem.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "codec/error.hpp"
#include "fs/namespace/write_buffer.hpp"

using ckpt::fs::memory_budget;
using ckpt::fs::write_buffer;

TEST_CASE("write_buffer: random writes and truncates match a byte vector across a spill",
          "[namespace]") {
  auto dir = boost::filesystem::temp_directory_path() / boost::filesystem::unique_path();
  boost::filesystem::create_directories(dir);
  for (std::uint64_t budget_mib : {0, 3, 64}) {
    auto budget = std::make_shared<memory_budget>(budget_mib << 20);
    std::mt19937_64 rng(budget_mib);
    // Two rounds on one budget: the second buffer gets recycled chunks full of old bytes, which
    // must still read as zeros where nothing was written.
    for (int round = 0; round < 2; ++round) {
      std::vector<std::byte> model;
      {
        write_buffer buf(budget, dir.string());
        for (int step = 0; step < 300; ++step) {
          if (rng() % 8 == 0) {
            std::uint64_t size = rng() % (6 << 20);
            buf.truncate(size);
            model.resize(size);
          } else {
            std::uint64_t off = rng() % (5 << 20);
            std::vector<std::byte> data(rng() % (1 << 20) + 1);
            for (auto& b : data) b = std::byte(rng());
            buf.write(off, data);
            if (model.size() < off + data.size()) model.resize(off + data.size());
            std::copy(data.begin(), data.end(), model.begin() + off);
          }
          REQUIRE(buf.size() == model.size());
        }
        std::vector<std::byte> all(model.size());
        buf.source().read(0, all);
        REQUIRE(all == model);
        std::vector<std::byte> tail(100);
        CHECK(buf.read(model.size() - 10, tail) == 10);
        CHECK(buf.read(model.size() + 5, tail) == 0);
        CHECK(buf.spilled() == (budget_mib < 6));
      }
      CHECK(budget->used() == 0);  // everything given back
      CHECK(budget->pooled_chunks() <= (budget_mib << 20) / write_buffer::chunk_bytes);
      CHECK(boost::filesystem::is_empty(dir));  // the staging file was anonymous
    }
    if (budget_mib >= 6) CHECK(budget->pooled_chunks() > 0);
    budget->trim();
    CHECK(budget->pooled_chunks() == 0);
  }
  boost::filesystem::remove_all(dir);
}

// -o scratch= naming a file (or a read-only directory): the spill past the budget cannot create
// its staging file. The writer gets EIO (an I/O error of the filesystem, which the FUSE boundary
// logs), not ENOTDIR about a path of its own; what was written before stays readable.
TEST_CASE("write_buffer: an unusable staging directory fails the spill with EIO", "[namespace]") {
  auto file = boost::filesystem::temp_directory_path() / boost::filesystem::unique_path();
  { std::ofstream(file.string()) << "not a directory"; }
  auto budget = std::make_shared<memory_budget>(std::uint64_t(1) << 20);
  write_buffer buf(budget, (file / "staging").string());
  const std::vector<std::byte> mib(write_buffer::chunk_bytes, std::byte{7});
  buf.write(0, mib);  // in memory
  try {
    buf.write(mib.size(), mib);  // needs the staging file
    FAIL("the spill into a file's subdirectory succeeded");
  } catch (const ckpt::io_error& e) {
    CHECK(e.sys_errno() == EIO);
    CHECK(std::string(e.what()).find("Not a directory") != std::string::npos);
  }
  std::vector<std::byte> back(mib.size());
  CHECK(buf.read(0, back) == back.size());
  CHECK(back == mib);
  boost::filesystem::remove(file);
}

// `ckptctl status` reports the budget's spilled bytes: every chunk that went to the staging
// file counts until its buffer drops it (truncate, destruction) or becomes a published head
// image (drop_memory: from then on the head store counts the file).
TEST_CASE("write_buffer: spilled chunks are counted in the budget until freed or published",
          "[namespace]") {
  auto dir = boost::filesystem::temp_directory_path() / boost::filesystem::unique_path();
  boost::filesystem::create_directories(dir);
  constexpr std::uint64_t mib = std::uint64_t(1) << 20;
  auto budget = std::make_shared<memory_budget>(2 * mib);  // two chunks fit in memory
  std::vector<std::byte> chunk(mib);
  for (std::size_t i = 0; i < chunk.size(); ++i) chunk[i] = std::byte(i * 7);
  {
    write_buffer buf(budget, dir.string());
    // Without a stream, each new chunk past the budget takes the memory of the lowest full one,
    // which goes to the file: chunks 0-2 end in the file, 3 and 4 in memory.
    for (std::uint64_t i = 0; i < 5; ++i) buf.write(i * mib, chunk);
    CHECK(budget->used() == 2 * mib);
    CHECK(budget->spilled() == 3 * mib);
    // Truncating into chunk 3 drops chunk 4 (in memory); chunk 3 stays whole.
    buf.truncate(3 * mib + 10);
    CHECK(budget->spilled() == 3 * mib);
    CHECK(budget->used() == mib);
    // A hole costs nothing: a write at 8 MiB places that one chunk only (in memory).
    buf.write(8 * mib, std::span(chunk).first(100));
    CHECK(budget->spilled() == 3 * mib);
    CHECK(budget->used() == 2 * mib);
    {
      write_buffer other(budget, dir.string());  // no memory left: all of it spills
      other.write(0, chunk);
      other.write(mib, chunk);
      CHECK(budget->spilled() == 5 * mib);
    }
    CHECK(budget->spilled() == 3 * mib);  // the other buffer's chunks went with it
    // As the head store publishes an image: memory to the file, then the memory goes.
    buf.backing_file();
    buf.copy_memory_to_file();
    buf.drop_memory();
    CHECK(budget->used() == 0);
    CHECK(budget->spilled() == 0);
    std::vector<std::byte> back(mib);
    buf.read_fully(mib, back);
    CHECK(back == chunk);  // still readable, from the file
  }
  CHECK(budget->spilled() == 0);
  {
    write_buffer buf(budget, dir.string());
    for (std::uint64_t i = 0; i < 4; ++i) buf.write(i * mib, chunk);
    CHECK(budget->spilled() == 2 * mib);
    buf.truncate(0);
    CHECK(budget->spilled() == 0);
    CHECK(budget->used() == 0);
  }
  boost::filesystem::remove_all(dir);
}

namespace {

struct staging_dir {
  boost::filesystem::path path =
      boost::filesystem::temp_directory_path() / boost::filesystem::unique_path();
  staging_dir() { boost::filesystem::create_directories(path); }
  ~staging_dir() { boost::filesystem::remove_all(path); }
};

std::vector<std::byte> pattern(std::size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::byte((i * 31 + std::size_t(seed)) & 0xff);
  return v;
}

}  // namespace

TEST_CASE("write_buffer: the contiguous mark follows sequential and out-of-order writes",
          "[namespace][stream]") {
  staging_dir dir;
  write_buffer buf(std::make_shared<memory_budget>(std::uint64_t(64) << 20), dir.path.string());
  const auto a = pattern(3000, 1);
  buf.write(0, std::span(a).first(1000));
  CHECK(buf.contiguous() == 1000);
  buf.write(2000, std::span(a).subspan(2000));  // ahead of the mark
  CHECK(buf.contiguous() == 1000);
  buf.write(1000, std::span(a).subspan(1000, 1000));  // fills the gap: both runs join
  CHECK(buf.contiguous() == 3000);
  buf.truncate(500);
  CHECK(buf.contiguous() == 500);
  CHECK(buf.streamable());
  buf.no_stream();
  CHECK_FALSE(buf.streamable());
}

TEST_CASE("write_buffer: a stream waits for bytes, goes stale when what it read changes",
          "[namespace][stream]") {
  staging_dir dir;
  // A small budget: the stream reads across memory and the staging file.
  write_buffer buf(std::make_shared<memory_budget>(std::uint64_t(1) << 20), dir.path.string());
  const auto data = pattern(std::size_t(3) << 20, 2);
  buf.write(0, std::span(data).first(1000));
  buf.begin_stream();
  CHECK(buf.await(1000));
  // A reader waiting for bytes not written yet is woken by the write that brings them.
  std::atomic<bool> got{false};
  std::thread reader([&] {
    got = buf.await(std::uint64_t(2) << 20);
    std::vector<std::byte> out(std::size_t(2) << 20);
    buf.read_fully(0, out);
    CHECK(std::equal(out.begin(), out.end(), data.begin()));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(got.load());
  buf.write(1000, std::span(data).subspan(1000));
  reader.join();
  CHECK(got.load());
  CHECK_FALSE(buf.stale());
  // The same bytes again leave the stream good; other bytes below what it read make it stale.
  buf.write(100, std::span(data).subspan(100, 4096));
  CHECK_FALSE(buf.stale());
  // Bytes the stream has not read yet may change freely.
  const auto other = pattern(4096, 9);
  buf.write((std::uint64_t(2) << 20) + 10, other);
  CHECK_FALSE(buf.stale());
  // The store's overwrite (its reconstruction) works while the stream is good...
  const auto recon = pattern(64, 5);
  buf.overwrite(0, recon);
  CHECK(buf.modified());
  buf.write(1 << 20, other);
  CHECK(buf.stale());
  CHECK_FALSE(buf.await(1));  // a stale stream stops
  // ...and does nothing once it is stale: it would replace bytes written after the read.
  buf.overwrite(1 << 20, recon);
  std::vector<std::byte> now(other.size());
  buf.read_fully(1 << 20, now);
  CHECK(now == other);
  // After the stream's reader is gone, the buffer is an ordinary staged file again.
  buf.complete_stream();
  CHECK(buf.await_complete());
  buf.end_stream();
  CHECK_FALSE(buf.stale());
  buf.overwrite(1 << 20, recon);
  buf.read_fully(1 << 20, std::span(now).first(recon.size()));
  CHECK(std::equal(recon.begin(), recon.end(), now.begin()));
}

TEST_CASE("write_buffer: completing or cancelling a stream wakes its waiters",
          "[namespace][stream]") {
  staging_dir dir;
  for (const bool complete : {true, false}) {
    write_buffer buf(std::make_shared<memory_budget>(std::uint64_t(8) << 20), dir.path.string());
    const auto data = pattern(5000, 3);
    buf.write(0, data);
    buf.begin_stream();
    std::atomic<int> result{-1}, finished{-1};
    std::thread waiter([&] {
      result = buf.await(4000 + 10000);  // more than the file will ever hold
      finished = buf.await_complete();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    CHECK(result.load() == -1);
    if (complete)
      buf.complete_stream();
    else
      buf.cancel_stream();
    waiter.join();
    CHECK(result.load() == 0);  // the finished file is shorter; a cancelled stream reads nothing
    CHECK(finished.load() == (complete ? 1 : 0));
    if (complete) CHECK(buf.await(5000));  // within the finished file
  }
}

TEST_CASE("write_buffer: a truncate below what a stream read makes it stale",
          "[namespace][stream]") {
  staging_dir dir;
  write_buffer buf(std::make_shared<memory_budget>(std::uint64_t(8) << 20), dir.path.string());
  const auto data = pattern(8192, 4);
  buf.write(0, data);
  buf.begin_stream();
  std::vector<std::byte> out(4096);
  REQUIRE(buf.await(4096));
  buf.read_fully(0, out);
  buf.truncate(6000);  // above what was read: fine
  CHECK_FALSE(buf.stale());
  buf.truncate(100);
  CHECK(buf.stale());
}

TEST_CASE("write_buffer: runs ahead of the mark merge, past the limit a stream waits for the end",
          "[namespace][stream]") {
  staging_dir dir;
  write_buffer buf(std::make_shared<memory_budget>(std::uint64_t(64) << 20), dir.path.string());
  // Two writers filling the two halves of a file, 1 KiB at a time, interleaved: 6000 writes
  // ahead of the mark (past kAheadMax if they did not merge) stay one run.
  const std::size_t half = 3000 * 1024;
  const auto data = pattern(2 * half, 6);
  for (std::size_t i = 0; i < 3000; ++i) {
    buf.write(half + i * 1024, std::span(data).subspan(half + i * 1024, 1024));
    if (i < 2999) buf.write((i + 1) * 1024, std::span(data).subspan((i + 1) * 1024, 1024));
  }
  CHECK(buf.contiguous() == 0);      // byte 0 is not written yet
  CHECK(buf.streamable() == false);  // nothing from the start: not yet worth a stream
  buf.write(0, std::span(data).first(1024));
  CHECK(buf.contiguous() == 2 * half);  // the first run reached the second: all of it
  CHECK(buf.streamable());
  // Overlapping and adjacent runs merge too.
  buf.write(2 * half + 2048, std::span(data).first(1024));
  buf.write(2 * half + 1024, std::span(data).first(1024));  // adjacent before
  buf.write(2 * half + 2560, std::span(data).first(1024));  // overlapping
  buf.write(2 * half, std::span(data).first(1024));
  CHECK(buf.contiguous() == 2 * half + 3584);
  // A truncate drops what lay past the new end.
  buf.write(2 * half + 8192, std::span(data).first(1024));
  buf.truncate(2 * half + 8500);
  buf.write(2 * half + 3584, std::span(data).first(8500 - 3584));
  CHECK(buf.contiguous() == 2 * half + 8500);

  // Scattered writes beyond the limit: the mark stops following, and a stream waiting for
  // bytes past it waits for the end of the file instead of failing.
  write_buffer scattered(std::make_shared<memory_budget>(std::uint64_t(64) << 20),
                         dir.path.string());
  scattered.write(0, std::span(data).first(100));
  scattered.begin_stream();
  for (std::size_t i = 0; i < 5000; ++i) scattered.write(200 + i * 300, std::span(data).first(10));
  std::atomic<int> got{-1};
  std::thread waiter([&] { got = scattered.await(150); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  CHECK(got.load() == -1);
  scattered.complete_stream();
  waiter.join();
  CHECK(got.load() == 1);
}

TEST_CASE("write_buffer: chunks a stream settled make room for new ones instead of a raw spill",
          "[namespace][stream]") {
  staging_dir dir;
  constexpr std::size_t mib = std::size_t(1) << 20;
  auto budget = std::make_shared<memory_budget>(2 * mib);  // two chunks fit in memory
  write_buffer buf(budget, dir.path.string());
  const auto data = pattern(6 * mib, 8);
  auto chunk_of = [&](std::size_t i) { return std::span(data).subspan(i * mib, mib); };
  const std::vector<std::byte> zeros(mib);
  buf.write(0, chunk_of(0));
  buf.write(mib, chunk_of(1));
  // Settling means nothing without a stream; a full chunk makes room instead: chunk 2 takes
  // chunk 0's memory, and chunk 0 goes to the file whole.
  buf.settle(2 * mib);
  buf.write(2 * mib, chunk_of(2));
  const int fd = buf.backing_file();
  std::vector<std::byte> in_file(mib);
  auto file_chunk = [&](std::size_t i) {
    REQUIRE(::pread(fd, in_file.data(), mib, off_t(i * mib)) == ssize_t(mib));
    return in_file;
  };
  auto equal = [](const std::vector<std::byte>& a, std::span<const std::byte> b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  };
  CHECK(equal(file_chunk(0), chunk_of(0)));
  CHECK(file_chunk(2) == zeros);
  CHECK(budget->used() == 2 * mib);
  CHECK(budget->spilled() == mib);

  buf.begin_stream();
  std::vector<std::byte> out(3 * mib);
  REQUIRE(buf.await(3 * mib));
  buf.read_fully(0, out);
  CHECK(std::equal(out.begin(), out.end(), data.begin()));
  const auto recon = pattern(mib, 99);  // the stream's reconstruction of chunk 1
  buf.overwrite(mib, recon);
  buf.settle(2 * mib);
  // Chunk 3 gets chunk 1's memory (settled): chunk 1's reconstruction is written to the file,
  // chunk 3's bytes are not (the file still reads zeros there).
  buf.write(3 * mib, chunk_of(3));
  buf.backing_file();  // sized to the file again
  CHECK(equal(file_chunk(1), recon));
  CHECK(file_chunk(3) == zeros);
  CHECK(budget->used() == 2 * mib);
  CHECK(budget->spilled() == 2 * mib);
  // Chunk 2 is not settled (the stream is not done with it, and reads it next): chunk 4 takes
  // the memory of the newest full chunk, 3, which the stream reads last; chunk 4 does not
  // spill raw.
  buf.write(4 * mib, chunk_of(4));
  buf.backing_file();
  CHECK(equal(file_chunk(3), chunk_of(3)));
  CHECK(file_chunk(4) == zeros);
  CHECK(file_chunk(2) == zeros);  // chunk 2 still in memory
  CHECK(budget->used() == 2 * mib);
  CHECK(budget->spilled() == 3 * mib);
  // Every byte reads as written (chunk 1 as overwritten), wherever it lives.
  std::vector<std::byte> all(5 * mib);
  buf.read_fully(0, all);
  CHECK(std::equal(all.begin(), all.begin() + mib, data.begin()));
  CHECK(std::equal(all.begin() + mib, all.begin() + 2 * mib, recon.begin()));
  CHECK(std::equal(all.begin() + 2 * mib, all.end(), data.begin() + 2 * mib));
  CHECK_FALSE(buf.stale());
  buf.complete_stream();
  buf.end_stream();
  // No stream any more: the lowest full chunk makes room (chunk 2 goes to the file for chunk 5).
  buf.write(5 * mib, chunk_of(5));
  buf.backing_file();
  CHECK(equal(file_chunk(2), chunk_of(2)));
  CHECK(file_chunk(5) == zeros);
  std::vector<std::byte> last(mib);
  buf.read_fully(5 * mib, last);
  CHECK(equal(last, chunk_of(5)));
}

namespace {

// Pages of [off, off + n) of `fd` in the page cache.
std::size_t resident_pages(int fd, std::uint64_t off, std::size_t n) {
  void* m = ::mmap(nullptr, n, PROT_READ, MAP_SHARED, fd, off_t(off));
  REQUIRE(m != MAP_FAILED);
  const long page = ::sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> v((n + std::size_t(page) - 1) / std::size_t(page));
  REQUIRE(::mincore(m, n, v.data()) == 0);
  ::munmap(m, n);
  return std::size_t(std::count_if(v.begin(), v.end(), [](unsigned char c) { return c & 1; }));
}

// Direct I/O that bypasses the page cache (tmpfs accepts O_DIRECT since Linux 6.6, but its
// pages are the page cache).
bool supports_direct_io(const boost::filesystem::path& dir) {
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0 || fs.f_type == TMPFS_MAGIC) return false;
  const auto p = dir / "direct_probe";
  const int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  if (fd >= 0) ::close(fd);
  boost::filesystem::remove(p);
  return fd >= 0;
}

}  // namespace

TEST_CASE("write_buffer: whole chunks go to the staging file by direct I/O and read back exactly",
          "[namespace][stream]") {
  staging_dir dir;
  constexpr std::size_t mib = std::size_t(1) << 20;
  auto budget = std::make_shared<memory_budget>(2 * mib);
  write_buffer buf(budget, dir.path.string());
  const std::size_t size = 5 * mib + 12345;  // a partial last chunk
  const auto data = pattern(size, 17);
  buf.write(0, std::span(data).first(2 * mib));
  buf.begin_stream();
  std::vector<std::byte> out(2 * mib);
  REQUIRE(buf.await(2 * mib));
  buf.read_fully(0, out);
  buf.settle(2 * mib);
  buf.write(2 * mib, std::span(data).subspan(2 * mib));  // chunks 0 and 1 make room
  buf.complete_stream();
  buf.end_stream();
  const int fd = buf.backing_file();
  const bool direct = supports_direct_io(dir.path);
  // Settled chunks (0, 1) went around the page cache, and so did the newest full chunks (3,
  // then 4) that made room for 4 and 5 while the stream was behind; 2 and 5 are in memory.
  if (direct) CHECK(resident_pages(fd, 0, 5 * mib) == 0);
  // As a head image is published: what is still in memory goes to the file, then the memory.
  buf.copy_memory_to_file();
  buf.drop_memory();
  if (direct) {
    CHECK(resident_pages(fd, 0, 5 * mib) == 0);     // chunk 2 whole, by direct I/O too
    CHECK(resident_pages(fd, 5 * mib, 12345) > 0);  // the partial last chunk is not
  }
  // The whole file in one read (a run of chunks written directly goes in one direct read), then
  // reads at any offset and length, across chunks and the partial last one, from wherever the
  // bytes are.
  std::vector<std::byte> whole(size);
  buf.read_fully(0, whole);
  REQUIRE(whole == data);
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {
    const std::size_t off = rng() % size;
    const std::size_t n = 1 + rng() % std::min<std::size_t>(size - off, 3 * mib);
    std::vector<std::byte> got(n);
    buf.read_fully(off, got);
    REQUIRE(std::equal(got.begin(), got.end(), data.begin() + std::ptrdiff_t(off)));
  }
  // And the file itself holds them (the kernel reads it directly under passthrough).
  std::vector<std::byte> file(size);
  REQUIRE(::pread(fd, file.data(), size, 0) == ssize_t(size));
  CHECK(file == data);

  // Changed afterwards through the page cache (a write, a hole, a truncate into a chunk written
  // directly): reads see every change, wherever each byte is.
  auto model = data;
  const auto other = pattern(300000, 23);
  buf.write(700000, other);  // across chunks 0 and 1
  std::copy(other.begin(), other.end(), model.begin() + 700000);
  buf.punch_hole(3 * mib + 100, 5000);  // part of chunk 3
  std::fill_n(model.begin() + 3 * mib + 100, 5000, std::byte(0));
  buf.punch_hole(mib, mib);  // all of chunk 1
  std::fill_n(model.begin() + mib, mib, std::byte(0));
  buf.truncate(4 * mib + 4097);  // inside chunk 4
  model.resize(4 * mib + 4097);
  buf.truncate(4 * mib + 9000);  // grown again: zeros
  model.resize(4 * mib + 9000);
  std::vector<std::byte> all(model.size());
  buf.read_fully(0, all);
  CHECK(all == model);
  for (int i = 0; i < 100; ++i) {
    const std::size_t off = rng() % model.size();
    const std::size_t n = 1 + rng() % (model.size() - off);
    std::vector<std::byte> got(n);
    buf.read_fully(off, got);
    REQUIRE(std::equal(got.begin(), got.end(), model.begin() + std::ptrdiff_t(off)));
  }
}

TEST_CASE("write_buffer: a writer ahead of its stream waits for room, never for a stream waiting",
          "[namespace][stream]") {
  using namespace std::chrono_literals;
  staging_dir dir;
  constexpr std::size_t mib = std::size_t(1) << 20;
  const auto data = pattern(4 * mib, 21);
  auto chunk_of = [&](std::size_t i) { return std::span(data).subspan(i * mib, mib); };
  auto elapsed = [](auto since) { return std::chrono::steady_clock::now() - since; };

  SECTION("no stream, or room in the budget: no wait") {
    auto budget = std::make_shared<memory_budget>(mib);
    write_buffer buf(budget, dir.path.string());
    buf.write(0, chunk_of(0));
    const auto t = std::chrono::steady_clock::now();
    buf.wait_for_room(mib, mib);  // the budget is full, but nothing streams
    buf.begin_stream();
    buf.wait_for_room(0, mib);  // a chunk it has already
    CHECK(elapsed(t) < 500ms);
  }
  SECTION("the wait ends when the stream settles a chunk, whose memory the write then takes") {
    auto budget = std::make_shared<memory_budget>(2 * mib);
    write_buffer buf(budget, dir.path.string());
    buf.write(0, chunk_of(0));
    buf.write(mib, chunk_of(1));
    buf.begin_stream();
    std::atomic<bool> done{false};
    std::thread writer([&] {
      buf.wait_for_room(2 * mib, mib);
      done = true;
      buf.write(2 * mib, chunk_of(2));
    });
    std::this_thread::sleep_for(200ms);
    CHECK_FALSE(done.load());  // the budget is full and chunks 0-1 are the stream's to settle
    std::vector<std::byte> out(mib);
    REQUIRE(buf.await(mib));
    buf.read_fully(0, out);
    buf.settle(mib);
    writer.join();
    CHECK(done.load());
    CHECK(budget->spilled() == mib);  // chunk 0 went to the file; chunk 2 is in its memory
    const int fd = buf.backing_file();
    std::vector<std::byte> in_file(mib);
    REQUIRE(::pread(fd, in_file.data(), mib, off_t(2 * mib)) == ssize_t(mib));
    CHECK(in_file == std::vector<std::byte>(mib));  // not spilled raw
  }
  SECTION("a stream waiting for bytes lets the writer spill at once (an out-of-order writer)") {
    auto budget = std::make_shared<memory_budget>(2 * mib);
    write_buffer buf(budget, dir.path.string());
    buf.write(mib, chunk_of(1));  // chunk 0 not written yet
    buf.write(2 * mib, chunk_of(2));
    buf.begin_stream();
    std::thread stream([&] { CHECK(buf.await(mib)); });
    std::this_thread::sleep_for(100ms);  // the stream waits for chunk 0
    const auto t = std::chrono::steady_clock::now();
    buf.wait_for_room(3 * mib, mib);
    CHECK(elapsed(t) < 500ms);
    buf.write(3 * mib, chunk_of(3));
    buf.write(0, chunk_of(0));  // what the stream waits for
    stream.join();
  }
  SECTION("a stream that completes, is cancelled or goes stale wakes a waiting writer") {
    for (int how = 0; how < 3; ++how) {
      auto budget = std::make_shared<memory_budget>(mib);
      write_buffer buf(budget, dir.path.string());
      buf.write(0, chunk_of(0));
      buf.begin_stream();
      std::vector<std::byte> out(100);
      REQUIRE(buf.await(100));
      buf.read_fully(0, out);  // the stream read these bytes
      const auto t = std::chrono::steady_clock::now();
      std::thread writer([&] { buf.wait_for_room(mib, mib); });
      std::this_thread::sleep_for(100ms);
      if (how == 0) buf.complete_stream();
      if (how == 1) buf.cancel_stream();
      if (how == 2) buf.write(0, pattern(100, 77));  // changes what the stream read
      writer.join();
      CHECK(elapsed(t) < 700ms);
      CHECK(elapsed(t) >= 100ms);
    }
  }
  SECTION("a stream that settles nothing for a second stops the waiting until it settles again") {
    auto budget = std::make_shared<memory_budget>(mib);
    write_buffer buf(budget, dir.path.string());
    buf.write(0, chunk_of(0));
    buf.begin_stream();
    auto t = std::chrono::steady_clock::now();
    buf.wait_for_room(mib, mib);
    CHECK(elapsed(t) >= 900ms);
    t = std::chrono::steady_clock::now();
    buf.wait_for_room(mib, mib);  // nothing settled since: no second wait
    CHECK(elapsed(t) < 500ms);
    buf.write(mib, chunk_of(1));  // chunk 0 goes to the file unsettled, chunk 1 takes its memory
    CHECK(budget->spilled() == mib);
    // The stream moves again (it reads and settles chunk 0): the writer waits for it again,
    // until it settles chunk 1, whose memory chunk 2 then takes.
    std::vector<std::byte> out(mib);
    REQUIRE(buf.await(mib));
    buf.read_fully(0, out);
    buf.settle(mib);
    std::atomic<bool> done{false};
    std::thread writer([&] {
      buf.wait_for_room(2 * mib, mib);
      done = true;
    });
    std::this_thread::sleep_for(200ms);
    CHECK_FALSE(done.load());
    REQUIRE(buf.await(2 * mib));
    buf.read_fully(mib, out);
    buf.settle(2 * mib);
    writer.join();
    CHECK(done.load());
    CHECK(budget->spilled() == 2 * mib);  // the wait itself moved chunk 1 to the file
    buf.write(2 * mib, chunk_of(2));
    CHECK(budget->spilled() == 2 * mib);  // chunks 0 and 1 in the file, chunk 2 in memory
    std::vector<std::byte> all(3 * mib);
    buf.read_fully(0, all);
    CHECK(std::equal(all.begin(), all.end(), data.begin()));
  }
}

TEST_CASE("write_buffer: after a stream settled the whole file, chunks written later make room too",
          "[namespace][stream]") {
  staging_dir dir;
  constexpr std::size_t mib = std::size_t(1) << 20;
  auto budget = std::make_shared<memory_budget>(mib);  // one chunk
  const auto data = pattern(4 * mib, 31);
  auto chunk_of = [&](std::size_t i) { return std::span(data).subspan(i * mib, mib); };
  write_buffer buf(budget, dir.path.string());
  std::optional<write_buffer> other(std::in_place, budget, dir.path.string());
  other->write(0, chunk_of(0));  // holds the budget's only chunk
  buf.begin_stream();
  buf.settle(~std::uint64_t(0));    // the stream has finished (declined, or done with its walk)
  buf.write(0, chunk_of(0));        // no memory, nothing of this buffer's to move: spilled raw
  other.reset();                    // the memory comes back
  buf.write(mib, chunk_of(1));      // in memory
  buf.write(2 * mib, chunk_of(2));  // chunk 1 moves to the file, chunk 2 takes its memory
  const int fd = buf.backing_file();
  std::vector<std::byte> in_file(mib);
  REQUIRE(::pread(fd, in_file.data(), mib, off_t(mib)) == ssize_t(mib));
  CHECK(std::equal(in_file.begin(), in_file.end(), chunk_of(1).begin()));
  REQUIRE(::pread(fd, in_file.data(), mib, off_t(2 * mib)) == ssize_t(mib));
  CHECK(in_file == std::vector<std::byte>(mib));  // chunk 2 is in memory, not spilled
  std::vector<std::byte> all(3 * mib);
  buf.read_fully(0, all);
  CHECK(std::equal(all.begin(), all.end(), data.begin()));
}
