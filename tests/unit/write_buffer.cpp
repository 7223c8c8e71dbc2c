// fs/namespace/write_buffer: writes at any offset, holes, truncate and a spill to the staging
// file half-way, checked against a plain byte vector.
#include <boost/filesystem.hpp>
#include <catch2/catch.hpp>
#include <fstream>
#include <random>
#include <vector>

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
    for (std::uint64_t i = 0; i < 5; ++i) buf.write(i * mib, chunk);
    CHECK(budget->used() == 2 * mib);
    CHECK(budget->spilled() == 3 * mib);
    // Truncating into chunk 3 drops chunk 4 (in the file); chunk 3 stays whole.
    buf.truncate(3 * mib + 10);
    CHECK(budget->spilled() == 2 * mib);
    // A hole costs nothing: a write at 8 MiB places that one chunk only.
    buf.write(8 * mib, std::span(chunk).first(100));
    CHECK(budget->spilled() == 3 * mib);
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
