// Exact regions larger than content_options::spill_bytes are encoded into a spill file on their
// way into the object (fs/content/spill_file.hpp), in the ingest path and in prune's rewrite
// (rekey): the bytes read back the same, and the spill directory is really used.
#include <boost/filesystem.hpp>
#include <catch2/catch.hpp>
#include <random>

#include "codec/error.hpp"
#include "codec/format/source.hpp"
#include "content_test_util.hpp"
#include "fs/content/content_store.hpp"
#include "fs/content/spill_file.hpp"

using namespace ckpt;
using namespace ckpt::test;

namespace {

// Half compressible, half random: both zstd and raw blocks.
bytes mixed_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  bytes out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = std::byte((i / 65536) % 2 ? rng() : rng() % 5);
  return out;
}

// Content options that spill exact regions longer than `bytes` into `store`/staging (created).
fs::content_options spilling(const bfs::path& store, std::uint64_t bytes) {
  bfs::create_directories(store / "staging");
  fs::content_options opt;
  opt.spill_dir = (store / "staging").string();
  opt.spill_bytes = bytes;
  return opt;
}

}  // namespace

TEST_CASE("spill_file: appends, maps back, reports offsets", "[content][spill]") {
  temp_dir d;
  fs::spill_file f(d.path.string());
  const bytes a = mixed_bytes(100000, 1), b = mixed_bytes(5, 2);
  REQUIRE(f.append(a) == 0);
  REQUIRE(f.append(b) == a.size());
  REQUIRE(f.size() == a.size() + b.size());
  fs::spill_file::mapping m(f);
  REQUIRE(m.bytes().size() == f.size());
  CHECK(std::equal(a.begin(), a.end(), m.bytes().begin()));
  CHECK(std::equal(b.begin(), b.end(), m.bytes().begin() + std::ptrdiff_t(a.size())));
  // Unlinked from the start: nothing is left in the directory.
  CHECK(bfs::is_empty(d.path));
  CHECK_THROWS_AS(fs::spill_file((d.path / "missing").string()), io_error);
}

TEST_CASE("a large exact file goes through the spill directory and reads back",
          "[content][spill]") {
  temp_dir d;
  const fs::content_options opt = spilling(d.path, std::uint64_t(1) << 20);
  const bfs::path spill = opt.spill_dir;
  const bytes data = mixed_bytes((std::size_t(21) << 20) + 12345, 3);
  fs::content_ref ref;
  {
    opened s(d.path, opt);
    ref = s.content.put("data/big.bin", format::memory_source(data));
    REQUIRE(s.content.info(ref).kind == "exact");
    REQUIRE(read_all(s.content, ref) == data);
    s.journal.sync();
  }
  CHECK(bfs::is_empty(spill));
  opened s(d.path, opt, {ref});  // cold: from the object
  REQUIRE(read_all(s.content, ref) == data);
  auto reader = s.content.open(ref);
  std::mt19937_64 rng(4);
  for (int i = 0; i < 40; ++i) {
    const std::uint64_t off = rng() % data.size();
    bytes part(std::min<std::uint64_t>(rng() % 3000000, data.size() - off));
    REQUIRE(reader->read(off, part) == part.size());
    REQUIRE(std::equal(part.begin(), part.end(), data.begin() + std::ptrdiff_t(off)));
  }
}

TEST_CASE("a spill directory that cannot be used fails the put cleanly", "[content][spill]") {
  temp_dir d;
  fs::content_options opt;
  opt.spill_dir = (d.path / "no-such-dir").string();
  opt.spill_bytes = std::uint64_t(1) << 20;
  opened s(d.path, opt);
  const bytes big = mixed_bytes(std::size_t(3) << 20, 5), small = mixed_bytes(1000, 6);
  // Above the threshold the region must go through the spill directory, so the put fails...
  CHECK_THROWS_AS(s.content.put("data/big.bin", format::memory_source(big)), io_error);
  // ...and leaves the store usable: below it, memory is used as before.
  const auto ref = s.content.put("data/small.bin", format::memory_source(small));
  CHECK(read_all(s.content, ref) == small);
}

TEST_CASE("prune's rewrite (rekey) copies exact regions through the spill file",
          "[content][spill]") {
  temp_dir d;
  fs::content_options opt = spilling(d.path, 0);  // every exact region spills, header included
  opt.bits = 3;
  trainer t(60000);
  opened s(d.path, opt);
  const auto v0 = s.content.put("run/step_0.safetensors", format::memory_source(t.step()));
  const auto v1 = s.content.put("run/step_1.safetensors", format::memory_source(t.step()));
  REQUIRE(s.content.info(v1).kind == "delta");
  const bytes before = read_all(s.content, v1);
  REQUIRE(s.content.rekey(v1.version) > 0);
  s.journal.sync();
  REQUIRE(s.content.info(v1).kind == "keyframe");
  CHECK(read_all(s.content, v1) == before);
  CHECK(read_all(s.content, v0).size() > 0);
  opened again(d.path, opt, {v0, v1});
  CHECK(read_all(again.content, v1) == before);
}
