// verify --deep along a chain (content_store::verify_chain): each slab of each version decoded
// once, on top of the version before, where verify() of one version at a time decodes its base's
// chain again through the read path once the tensors are larger than the cache. Same findings:
// a sound chain is sound, a damaged version and the ones coded on top of it are reported.
#include <boost/filesystem.hpp>
#include <catch2/catch.hpp>
#include <fstream>
#include <random>

#include "codec/format/source.hpp"
#include "content_test_util.hpp"
#include "fs/content/content_store.hpp"
#include "fs/store/journal.hpp"
#include "fs/store/object_store.hpp"

namespace bfs = boost::filesystem;
using namespace ckpt;
using bytes = std::vector<std::byte>;
using namespace ckpt::test;

namespace {

// Flips one bit in the middle of an object's file.
void flip_bit(const bfs::path& store, std::uint64_t object) {
  const bfs::path p = object_file(store, object);
  REQUIRE(bfs::exists(p));
  std::fstream f(p.string(), std::ios::in | std::ios::out | std::ios::binary);
  const auto at = std::streamoff(bfs::file_size(p) / 2);
  char c = 0;
  f.seekg(at);
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp(at);
  f.write(&c, 1);
}

}  // namespace

TEST_CASE("verify_chain decodes each slab of a chain once and finds what verify finds",
          "[content][verify]") {
  temp_dir d;
  fs::content_options opt;
  opt.bits = 3;
  opt.keyframe_interval = 100;
  opt.cache_bytes = std::uint64_t(8) << 20;  // far below one version: bases are not kept
  // 36 MiB of weights (three slabs of 16 MiB, the last short) and a tensor whose size is not a
  // multiple of a block.
  std::mt19937_64 rng(21);
  drifting_weights big(9'000'000, rng), odd(1'234'567, rng);
  std::vector<fs::content_ref> refs;
  opened s(d.path, opt);
  for (int v = 0; v < 6; ++v) {
    big.step(rng);
    odd.step(rng);
    refs.push_back(s.content.put(
        "run/step_" + std::to_string(v) + ".safetensors",
        format::memory_source(safetensors({{"w", big.values}, {"odd", odd.values}}))));
    REQUIRE(s.content.info(refs.back()).kind == (v == 0 ? "keyframe" : "delta"));
  }
  s.journal.sync();
  std::vector<std::uint64_t> chain;
  std::uint64_t stored = 0;
  for (const auto& r : refs) {
    chain.push_back(r.version);
    stored += s.content.info(r).stored_bytes;
  }

  // One version at a time: each reads its base through the read path, which decodes the base's
  // chain (no base stays in 8 MiB of cache).
  s.content.drop_caches();
  const auto before = s.content.usage();
  for (auto v : chain) REQUIRE(s.content.verify(v, true, {}).empty());
  const auto one_by_one = s.content.usage().chunk_frames_decoded - before.chunk_frames_decoded;
  CHECK(one_by_one > 2 * chain.size());

  // Along the chain: nothing decoded through the read path, every frame's bytes decoded once.
  s.content.drop_caches();
  const auto before_chain = s.content.usage();
  std::uint64_t decoded = 0;
  const auto problems =
      s.content.verify_chain(chain, [&](std::uint64_t bytes) { decoded += bytes; });
  REQUIRE(problems.size() == chain.size());
  for (std::size_t i = 0; i < chain.size(); ++i) {
    INFO("version " << i << ": " << problems[i]);
    CHECK(problems[i].empty());
  }
  CHECK(s.content.usage().chunk_frames_decoded == before_chain.chunk_frames_decoded);
  CHECK(decoded > stored * 8 / 10);
  CHECK(decoded <= stored);

  // A chain that skips a version: the next one's tensors read their base as reads do.
  const std::vector<std::uint64_t> gap{chain[0], chain[2], chain[3]};
  for (const auto& p : s.content.verify_chain(gap)) CHECK(p.empty());

  // Damage in the middle: that version, and the ones coded on top of it, not the ones below.
  flip_bit(d.path, s.content.info(refs[3]).object);
  s.content.drop_caches();
  const auto found = s.content.verify_chain(chain);
  for (std::size_t i = 0; i < 3; ++i) CHECK(found[i].empty());
  CHECK(!found[3].empty());
  CHECK(found[3] == s.content.verify(chain[3], true, {}));
  for (std::size_t i = 4; i < chain.size(); ++i)
    CHECK(found[i] == "its base version " + std::to_string(chain[i - 1]) + " is damaged");

  // Damage below a chain: its own checks pass, and its first version fails while its tracks
  // decode their base (the walk's failure path); the version above it is damaged through it.
  const std::vector<std::uint64_t> above{chain[4], chain[5]};
  s.content.drop_caches();
  const auto walked = s.content.verify_chain(above);
  INFO(walked[0]);
  CHECK(walked[0].find("checksum") != std::string::npos);
  CHECK(walked[1] == "its base version " + std::to_string(chain[4]) + " is damaged");
}

TEST_CASE("verify_chain of an empty chain and of a single keyframe", "[content][verify]") {
  temp_dir d;
  fs::content_options opt;
  opened s(d.path, opt);
  CHECK(s.content.verify_chain({}).empty());
  std::mt19937_64 rng(22);
  drifting_weights w(300'000, rng);
  const auto r =
      s.content.put("k.safetensors", format::memory_source(safetensors({{"w", w.values}})));
  const std::vector<std::uint64_t> one{r.version};
  const auto p = s.content.verify_chain(one);
  REQUIRE(p.size() == 1);
  CHECK(p[0].empty());
  // A version that is not in the store is reported, not thrown.
  const std::vector<std::uint64_t> missing{r.version + 100};
  const auto q = s.content.verify_chain(missing);
  REQUIRE(q.size() == 1);
  CHECK(q[0].find("not in the store") != std::string::npos);
}
