// fs/namespace/write_buffer as copy-on-write over a stored version (set_base), hole punching,
// data runs and sparse sizes: random operations checked against a plain byte vector, and the
// unchanged ranges it reports checked against the base's bytes.
#include <sys/resource.h>

#include <boost/filesystem.hpp>
#include <catch2/catch.hpp>
#include <csignal>
#include <cstring>
#include <random>
#include <vector>

#include "codec/error.hpp"
#include "fs/namespace/write_buffer.hpp"

using ckpt::fs::content_reader;
using ckpt::fs::memory_budget;
using ckpt::fs::write_buffer;

namespace {

constexpr std::uint64_t MiB = 1 << 20;

// A stored version as the content store serves it: bytes in memory, counting reads.
class vector_reader final : public content_reader {
 public:
  explicit vector_reader(std::vector<std::byte> b) : bytes_(std::move(b)) {}
  std::uint64_t size() const override { return bytes_.size(); }
  std::size_t read(std::uint64_t off, std::span<std::byte> out) const override {
    if (off >= bytes_.size()) return 0;
    const std::size_t n = std::min<std::size_t>(out.size(), bytes_.size() - off);
    std::memcpy(out.data(), bytes_.data() + off, n);
    read_bytes += n;
    return n;
  }
  mutable std::uint64_t read_bytes = 0;

 private:
  std::vector<std::byte> bytes_;
};

struct staging_dir {
  staging_dir()
      : path(boost::filesystem::temp_directory_path() / boost::filesystem::unique_path()) {
    boost::filesystem::create_directories(path);
  }
  ~staging_dir() { boost::filesystem::remove_all(path); }
  boost::filesystem::path path;
};

std::vector<std::byte> contents(const write_buffer& buf) {
  std::vector<std::byte> all(buf.size());
  buf.source().read(0, all);
  return all;
}

}  // namespace

TEST_CASE("write_buffer over a base: random writes, truncates and punches match a byte vector",
          "[namespace]") {
  staging_dir dir;
  for (std::uint64_t budget_mib : {0, 2, 64}) {
    auto budget = std::make_shared<memory_budget>(budget_mib << 20);
    std::mt19937_64 rng(budget_mib + 7);
    for (int round = 0; round < 3; ++round) {
      // The base: 6.5 MiB with a hole in the middle (its data runs say where data may be).
      std::vector<std::byte> base(6 * MiB + MiB / 2);
      for (std::size_t i = 0; i < base.size(); ++i)
        base[i] = (i >= 2 * MiB && i < 4 * MiB) ? std::byte{0} : std::byte(rng());
      auto reader = std::make_shared<vector_reader>(base);
      write_buffer buf(budget, dir.path.string());
      buf.set_base(reader, 42, {{0, 2 * MiB}, {4 * MiB, base.size()}});
      std::vector<std::byte> model = base;
      REQUIRE(buf.size() == base.size());
      for (int step = 0; step < 120; ++step) {
        const int op = int(rng() % 10);
        if (op == 0) {
          const std::uint64_t size = rng() % (9 * MiB);
          buf.truncate(size);
          model.resize(size);
        } else if (op <= 2) {
          const std::uint64_t off = rng() % (8 * MiB), len = rng() % (3 * MiB) + 1;
          buf.punch_hole(off, len);
          for (std::uint64_t i = off; i < std::min<std::uint64_t>(off + len, model.size()); ++i)
            model[i] = std::byte{0};
        } else {
          const std::uint64_t off = rng() % (8 * MiB);
          // Some writes are whole aligned chunks (they need nothing from the base).
          const bool whole = rng() % 4 == 0;
          std::vector<std::byte> data(whole ? MiB : rng() % (MiB + 100) + 1);
          for (auto& b : data) b = std::byte(rng());
          const std::uint64_t at = whole ? off / MiB * MiB : off;
          buf.write(at, data);
          if (model.size() < at + data.size()) model.resize(at + data.size());
          std::copy(data.begin(), data.end(), model.begin() + std::ptrdiff_t(at));
        }
        REQUIRE(buf.size() == model.size());
      }
      REQUIRE(contents(buf) == model);
      // Data runs: ascending, inside the file, and no nonzero byte outside them.
      const auto runs = buf.data_runs();
      std::vector<bool> covered(model.size(), false);
      std::uint64_t prev_end = 0;
      for (const auto& [from, to] : runs) {
        REQUIRE(from >= prev_end);
        REQUIRE(to <= model.size());
        for (std::uint64_t i = from; i < to; ++i) covered[i] = true;
        prev_end = to;
      }
      for (std::size_t i = 0; i < model.size(); ++i)
        if (model[i] != std::byte{0}) REQUIRE(covered[i]);
      // Unchanged ranges: chunk-aligned starts, and exactly the base's bytes.
      const auto u = buf.unchanged();
      CHECK(u.version == 42);
      for (const auto& [from, to] : u.ranges) {
        REQUIRE(from % MiB == 0);
        REQUIRE(to <= model.size());
        REQUIRE(to <= base.size());
        REQUIRE(std::equal(model.begin() + std::ptrdiff_t(from), model.begin() + std::ptrdiff_t(to),
                           base.begin() + std::ptrdiff_t(from)));
      }
      // As a backing file (a head image) every byte must be in the file: the base goes.
      buf.backing_file();
      buf.copy_memory_to_file();
      CHECK(buf.unchanged().ranges.empty());
      REQUIRE(contents(buf) == model);
    }
    CHECK(budget->used() == 0);
  }
}

TEST_CASE("write_buffer over a base: a small write reads one chunk of the base", "[namespace]") {
  staging_dir dir;
  auto budget = std::make_shared<memory_budget>(64 << 20);
  std::vector<std::byte> base(64 * MiB, std::byte{7});
  auto reader = std::make_shared<vector_reader>(base);
  write_buffer buf(budget, dir.path.string());
  buf.set_base(reader, 1, {{0, base.size()}});
  const std::vector<std::byte> four_k(4096, std::byte{1});
  buf.write(10 * MiB + 100, four_k);
  CHECK(reader->read_bytes == MiB);  // the touched chunk, not the file
  CHECK(budget->used() == MiB);      // one chunk held
  const auto u = buf.unchanged();
  REQUIRE(u.ranges.size() == 2);
  CHECK(u.ranges[0] == std::pair<std::uint64_t, std::uint64_t>{0, 10 * MiB});
  CHECK(u.ranges[1] == std::pair<std::uint64_t, std::uint64_t>{11 * MiB, 64 * MiB});
  CHECK(buf.allocated_bytes() == 64 * MiB);
  CHECK_THROWS_AS(buf.set_base(reader, 1, {}), ckpt::io_error);  // only on an empty buffer
}

TEST_CASE("write_buffer: sparse sizes cost nothing and punched chunks are given back",
          "[namespace]") {
  staging_dir dir;
  auto budget = std::make_shared<memory_budget>(64 << 20);
  write_buffer buf(budget, dir.path.string());
  const std::vector<std::byte> data(4096, std::byte{9});
  buf.write(5ull << 40, data);  // 5 TiB in: one chunk
  buf.truncate(10ull << 40);
  CHECK(buf.size() == (10ull << 40));
  CHECK(budget->used() == MiB);
  const auto runs = buf.data_runs();
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].first == (5ull << 40));
  CHECK(buf.allocated_bytes() == MiB);
  std::vector<std::byte> out(8192);
  CHECK(buf.read((5ull << 40) - 4096, out) == 8192);
  CHECK(
      std::all_of(out.begin(), out.begin() + 4096, [](std::byte b) { return b == std::byte{0}; }));
  CHECK(std::all_of(out.begin() + 4096, out.end(), [](std::byte b) { return b == std::byte{9}; }));
  buf.punch_hole(5ull << 40, MiB);
  CHECK(budget->used() == 0);
  CHECK(buf.data_runs().empty());
  CHECK(buf.size() == (10ull << 40));
}

namespace {

// Files this process writes may grow to `bytes` at most while it lives (RLIMIT_FSIZE, with
// SIGXFSZ ignored: a write past it fails with EFBIG instead of killing the process).
class file_size_limit {
 public:
  explicit file_size_limit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old_);
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit lim = old_;
    lim.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &lim);
  }
  ~file_size_limit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }
  file_size_limit(const file_size_limit&) = delete;
  file_size_limit& operator=(const file_size_limit&) = delete;

 private:
  rlimit old_{};
  void (*old_handler_)(int) = SIG_DFL;
};

int byte_at(const write_buffer& buf, std::uint64_t off) {
  std::byte b{};
  REQUIRE(buf.read(off, std::span(&b, 1)) == 1);
  return int(b);
}

}  // namespace

TEST_CASE("write_buffer over a base: a write that fails leaves the chunk's base bytes readable",
          "[namespace]") {
  // No memory: a write into a chunk of the base copies the chunk's base bytes into the staging
  // file first. When that copy fails (the disk full), the write fails, and the chunk must read
  // the base again, not zeros (then stored by the next commit), and a retry must work.
  staging_dir dir;
  auto budget = std::make_shared<memory_budget>(0);
  auto reader = std::make_shared<vector_reader>(std::vector<std::byte>(4 * MiB, std::byte{0xAA}));
  write_buffer buf(budget, dir.path.string());
  buf.set_base(reader, 1, {{0, 4 * MiB}});
  const std::byte one{0x11};
  {
    file_size_limit limit(4096);
    CHECK_THROWS_AS(buf.write(2 * MiB + 5, std::span(&one, 1)), ckpt::io_error);
  }
  CHECK(byte_at(buf, 2 * MiB + 5) == 0xAA);
  CHECK(byte_at(buf, 2 * MiB + 100) == 0xAA);
  CHECK(budget->spilled() == 0);  // nothing counted as in the staging file
  buf.write(2 * MiB + 5, std::span(&one, 1));
  CHECK(byte_at(buf, 2 * MiB + 5) == 0x11);
  CHECK(byte_at(buf, 2 * MiB + 100) == 0xAA);
  CHECK(budget->spilled() == MiB);
}

TEST_CASE("write_buffer over a base: a write that fails into a punched chunk leaves it zeros",
          "[namespace]") {
  // A whole chunk punched over the base is a hole of the buffer's own. A write into it that
  // cannot get memory or a staging file fails, and the hole must stay: the base's bytes must
  // not show through again.
  staging_dir dir;
  auto budget = std::make_shared<memory_budget>(0);
  auto reader = std::make_shared<vector_reader>(std::vector<std::byte>(4 * MiB, std::byte{0xAA}));
  write_buffer buf(budget, (dir.path / "missing").string());  // no staging file can be made
  buf.set_base(reader, 1, {{0, 4 * MiB}});
  buf.punch_hole(MiB, MiB);
  REQUIRE(byte_at(buf, MiB + 100) == 0);
  const std::byte one{0x11};
  CHECK_THROWS(buf.write(MiB + 5, std::span(&one, 1)));
  CHECK(byte_at(buf, MiB + 5) == 0);
  CHECK(byte_at(buf, MiB + 100) == 0);
  CHECK(byte_at(buf, 2 * MiB) == 0xAA);  // the rest still the base
}
