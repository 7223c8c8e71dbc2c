// Cold reads of tensors larger than one chunk (4 codec blocks): served chunk by chunk through a
// chain of deltas, they must equal what the version read as when it was written (the whole-tensor
// reconstruction), for reads of any offset and length, in any order, across chunk boundaries,
// through read() and peek(), after the caches are dropped and after a reopen.
#include <boost/filesystem.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

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

// Compared without REQUIRE(a == b): Catch would print both megabyte vectors on a mismatch.
bool same(const bytes& a, const bytes& b) {
  return a == b;
}

// Reads of random offsets and lengths (up to 3 chunks, so that some span several), each
// compared with the expected bytes; through peek() where it gives a view, else read().
void random_reads(fs::content_store& c, const fs::content_ref& r, const bytes& expect,
                  std::uint64_t seed) {
  auto reader = c.open(r);
  std::mt19937_64 rng(seed);
  const std::size_t chunk = 4u << 20;
  std::size_t peeked = 0;
  for (int i = 0; i < 60; ++i) {
    const std::size_t off = rng() % expect.size();
    const std::size_t len = std::min<std::size_t>(1 + rng() % (3 * chunk), expect.size() - off);
    INFO("read " << i << " at " << off << " +" << len);
    if (i % 2) {
      const auto v = reader->peek(off, len);
      if (!v.bytes.empty()) {
        REQUIRE(v.bytes.size() == len);
        REQUIRE(std::equal(v.bytes.begin(), v.bytes.end(), expect.begin() + std::ptrdiff_t(off)));
        ++peeked;
        continue;
      }
    }
    bytes out(len);
    REQUIRE(reader->read(off, out) == len);
    REQUIRE(std::equal(out.begin(), out.end(), expect.begin() + std::ptrdiff_t(off)));
  }
  // Reads inside one chunk are served as views of it.
  REQUIRE(peeked > 0);
}

// The store's counters once read-ahead's decodes in flight are done: two snapshots 50 ms apart
// agree (a decode counts its chunk when it starts and its frames when it ends).
fs::content_store::resources settled_usage(const fs::content_store& c) {
  auto u = c.usage();
  for (int i = 0; i < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto w = c.usage();
    if (w.chunks_decoded == u.chunks_decoded && w.chunk_frames_decoded == u.chunk_frames_decoded)
      return w;
    u = w;
  }
  return u;
}

}  // namespace

TEST_CASE("chunked cold reads equal the written reconstruction at any offset",
          "[content][chunked]") {
  temp_dir d;
  fs::content_options opt;
  opt.bits = 3;
  opt.keyframe_interval = 100;
  // 3.3 M floats: 13 blocks of 1 MiB, chunks of 4 blocks, the last chunk short; a second tensor
  // not a multiple of a block, so chunk boundaries do not fall on page boundaries of the file.
  std::mt19937_64 rng(11);
  drifting_weights big(3'300'000, rng), odd(1'234'567, rng);
  std::vector<fs::content_ref> refs;
  std::vector<bytes> served;
  {
    opened s(d.path, opt);
    for (int v = 0; v < 4; ++v) {
      big.step(rng);
      odd.step(rng);
      const bytes file = safetensors({{"odd", odd.values}, {"w", big.values}});
      refs.push_back(s.content.put("run/step_" + std::to_string(v) + ".safetensors",
                                   format::memory_source(file)));
      REQUIRE(s.content.info(refs.back()).kind == (v == 0 ? "keyframe" : "delta"));
      served.push_back(read_all(s.content, refs.back()));  // warm: the written reconstruction
      if (v == 0) REQUIRE(same(served.back(), file));
    }
    // The decode work of a cold read: each of the newest version's 6 chunks (4 of the large
    // tensor, 2 of the other) once, through the whole chain (no base is cached: a frame of each
    // of the 4 versions per chunk), none of them a repeat; read again after the caches are
    // dropped, every chunk is one.
    for (int round = 0; round < 2; ++round) {
      INFO("round " << round);
      settled_usage(s.content);  // no decode of an earlier read still in flight
      s.content.drop_caches();
      const auto before = s.content.usage();
      REQUIRE(same(read_all(s.content, refs[3]), served[3]));
      const auto after = settled_usage(s.content);
      CHECK(after.chunks_decoded - before.chunks_decoded == 6);
      CHECK(after.chunks_decoded_again - before.chunks_decoded_again == (round ? 6 : 0));
      CHECK(after.chunk_frames_decoded - before.chunk_frames_decoded == 24);
    }
    // Cold: every version, newest first (each decodes its chain chunk by chunk).
    s.content.drop_caches();
    for (std::size_t v = refs.size(); v-- > 0;) {
      INFO("version " << v);
      REQUIRE(same(read_all(s.content, refs[v]), served[v]));
    }
    // Random offsets on cold caches, and with the base's chunks partly cached.
    s.content.drop_caches();
    random_reads(s.content, refs[3], served[3], 1);
    random_reads(s.content, refs[2], served[2], 2);
    s.content.drop_caches();
    random_reads(s.content, refs[1], served[1], 3);
    random_reads(s.content, refs[3], served[3], 4);
    s.journal.sync();
  }
  opened s(d.path, opt, refs);
  for (std::size_t v = 0; v < refs.size(); ++v)
    REQUIRE(same(read_all(s.content, refs[v]), served[v]));
  random_reads(s.content, refs[3], served[3], 5);
}

TEST_CASE("versions without a block index (older stores) read the same, also under indexed deltas",
          "[content][chunked]") {
  temp_dir d;
  fs::content_options opt;
  opt.bits = 3;
  opt.keyframe_interval = 100;
  std::mt19937_64 rng(12);
  drifting_weights big(2'500'000, rng);
  std::vector<fs::content_ref> refs;
  std::vector<bytes> served;
  // Index off, on, off, on: every mix of an indexed delta over an unindexed base and back.
  for (int v = 0; v < 4; ++v) {
    opt.block_index = v % 2 == 1;
    opened s(d.path, opt, refs);
    big.step(rng);
    const bytes file = safetensors({{"w", big.values}});
    refs.push_back(s.content.put("run/step_" + std::to_string(v) + ".safetensors",
                                 format::memory_source(file)));
    REQUIRE(s.content.info(refs.back()).kind == (v == 0 ? "keyframe" : "delta"));
    served.push_back(read_all(s.content, refs.back()));
    s.journal.sync();
  }
  opt.block_index = true;
  opened s(d.path, opt, refs);
  for (std::size_t v = refs.size(); v-- > 0;) {
    INFO("version " << v);
    REQUIRE(same(read_all(s.content, refs[v]), served[v]));
  }
  s.content.drop_caches();
  random_reads(s.content, refs[3], served[3], 7);
  s.content.drop_caches();
  random_reads(s.content, refs[2], served[2], 8);
  // verify --deep accepts both kinds of version.
  for (const auto& r : refs) REQUIRE(s.content.verify(r.version, true, {}).empty());
}

TEST_CASE("a rekey gives an unindexed version's lossless frames a block index",
          "[content][chunked]") {
  // A delta version written without block indexes (an older store) with a lossless frame (Adam's
  // state under optimizer=exact): rewriting it as a keyframe walks that frame's blocks on disk,
  // header by header, to index them (retention.cpp, copy_encoded).
  temp_dir d;
  fs::content_options opt;
  opt.block_index = false;
  opt.exact_optimizer = true;
  std::mt19937_64 rng(13);
  drifting_weights w(600'000, rng), extra(300'000, rng);
  std::vector<fs::content_ref> refs;
  std::vector<bytes> served;
  {
    opened s(d.path, opt);
    for (int v = 0; v < 2; ++v) {
      w.step(rng);
      extra.step(rng);
      refs.push_back(s.content.put("run/step_" + std::to_string(v) + ".safetensors",
                                   format::memory_source(safetensors(
                                       {{"w", w.values}, {"state.0.exp_avg", extra.values}}))));
    }
    REQUIRE(s.content.info(refs[1]).kind == "delta");
    for (const auto& r : refs) served.push_back(read_all(s.content, r));
    s.journal.sync();
  }
  opt.block_index = true;
  opened s(d.path, opt, refs);
  REQUIRE(s.content.rekey(refs[1].version) > 0);
  CHECK(s.content.info(refs[1]).kind == "keyframe");
  s.content.drop_caches();
  CHECK(same(read_all(s.content, refs[1]), served[1]));
  random_reads(s.content, refs[1], served[1], 9);
  CHECK(s.content.verify(refs[1].version, true, {}).empty());
}

TEST_CASE("a read the kernel makes away from the reader decodes one block, not its chunk",
          "[content][chunked]") {
  temp_dir d;
  fs::content_options opt;
  opt.bits = 3;
  opt.keyframe_interval = 100;
  std::mt19937_64 rng(13);
  // "a" (8 blocks, the last partial: two chunks of 4) then "b", in both file and predicted
  // order.
  drifting_weights a(1'900'000, rng), b(2'000'000, rng);
  std::vector<fs::content_ref> refs;
  std::vector<bytes> served;
  opened s(d.path, opt);
  for (int v = 0; v < 2; ++v) {
    a.step(rng);
    b.step(rng);
    const bytes file = safetensors({{"a", a.values}, {"b", b.values}});
    refs.push_back(s.content.put("run/step_" + std::to_string(v) + ".safetensors",
                                 format::memory_source(file)));
    served.push_back(read_all(s.content, refs.back()));
  }
  const bytes& want = served[1];
  std::uint64_t header = 0;
  std::memcpy(&header, want.data(), 8);
  const std::size_t a_at = 8 + header, b_at = a_at + 4 * a.values.size();
  auto read_at = [&](const fs::content_reader& r, std::size_t off, std::size_t len) {
    bytes out(len);
    REQUIRE(r.read(off, out) == len);
    return std::equal(out.begin(), out.end(), want.begin() + std::ptrdiff_t(off));
  };
  s.content.drop_caches();
  auto reader = s.content.open(refs[1]);
  const auto strays = [&] { return s.content.usage().stray_blocks_decoded; };
  const std::uint64_t before = strays();
  // The reader goes through "a" (its two chunks) to "b": its own reads, chunks decoded.
  REQUIRE(read_at(*reader, a_at + 4096, 4096));
  REQUIRE(read_at(*reader, a_at + (4u << 20) + 4096, 4096));
  REQUIRE(read_at(*reader, b_at + 8192, 4096));
  CHECK(strays() == before);
  // Behind the reader, a few pages of a chunk nobody has: one block, through the chain (the
  // delta and its keyframe: two frames), nothing cached. Counted once read-ahead's decodes of
  // the reads above are done.
  const auto settled = [&] { return settled_usage(s.content); };
  settled();
  s.content.drop_caches();
  const auto u0 = s.content.usage();
  REQUIRE(read_at(*reader, a_at + 3 * (1u << 20) + 100, 8192));  // block 3 of "a"'s chunk 0
  const auto u1 = settled();
  CHECK(u1.stray_blocks_decoded == u0.stray_blocks_decoded + 1);
  CHECK(u1.stray_bytes_decoded == u0.stray_bytes_decoded + (1u << 20));
  CHECK(u1.chunk_frames_decoded == u0.chunk_frames_decoded + 2);
  CHECK(u1.chunks_decoded == u0.chunks_decoded);
  // The same block again: the chunk (decoded and cached), not the block a second time.
  REQUIRE(read_at(*reader, a_at + 3 * (1u << 20) + 40000, 8192));
  const auto u2 = settled();
  CHECK(u2.stray_blocks_decoded == u1.stray_blocks_decoded);
  CHECK(u2.chunks_decoded == u1.chunks_decoded + 1);
  // Two blocks, or more than a few pages: read as usual (the chunk).
  s.content.drop_caches();
  REQUIRE(read_at(*reader, a_at + (1u << 20) - 4096, 8192));
  CHECK(strays() == before + 1);
  s.content.drop_caches();
  REQUIRE(read_at(*reader, a_at, 512u << 10));
  CHECK(strays() == before + 1);
  // The last block of "a", partial, in its second chunk (behind the reader too).
  s.content.drop_caches();
  REQUIRE(read_at(*reader, a_at + 7 * (1u << 20) + 1000, 4096));
  CHECK(strays() == before + 2);
  // The reader's own place is never a stray, also in a chunk nobody has.
  s.content.drop_caches();
  REQUIRE(read_at(*reader, b_at + 100, 4096));
  CHECK(strays() == before + 2);
}

TEST_CASE("a cold read of a tensor coded as values decodes one frame, not its chain",
          "[content][chunked]") {
  // "w" drifts (a delta on its base at every version); "m" (SGD's momentum buffer by its name:
  // optimizer state) is new at every version, so each of its deltas codes it as values (intra,
  // every slab). Reading the newest version cold decodes w's chunks through the whole chain and
  // m's from its own frame alone.
  temp_dir d;
  fs::content_options opt;
  opt.keyframe_interval = 100;
  std::mt19937_64 rng(12);
  drifting_weights w(3'300'000, rng);  // 4 chunks
  std::vector<float> m(2'000'000);     // 2 chunks, one slab
  std::exponential_distribution<float> mag(1000.0f);
  std::bernoulli_distribution coin(0.5);
  opened s(d.path, opt);
  std::vector<fs::content_ref> refs;
  std::vector<bytes> served;
  for (int v = 0; v < 4; ++v) {
    w.step(rng);
    for (auto& x : m) x = (coin(rng) ? 1.0f : -1.0f) * mag(rng);
    refs.push_back(s.content.put(
        "run/step_" + std::to_string(v) + ".safetensors",
        format::memory_source(safetensors({{"state.0.momentum_buffer", m}, {"w", w.values}}))));
    served.push_back(read_all(s.content, refs.back()));
  }
  const auto detail = s.content.detail(refs[3]);
  REQUIRE(detail.tensors.at(0).mode == "intra");
  settled_usage(s.content);
  s.content.drop_caches();
  const auto before = s.content.usage();
  REQUIRE(same(read_all(s.content, refs[3]), served[3]));
  const auto after = settled_usage(s.content);
  CHECK(after.chunks_decoded - before.chunks_decoded == 6);
  CHECK(after.chunk_frames_decoded - before.chunk_frames_decoded == 4 * 4 + 2 * 1);
  // Every version still reads as written, newest first and in pieces.
  s.content.drop_caches();
  for (std::size_t v = refs.size(); v-- > 0;)
    REQUIRE(same(read_all(s.content, refs[v]), served[v]));
  s.content.drop_caches();
  random_reads(s.content, refs[2], served[2], 5);
  // Frames without a block index (stores from before it) take the whole-tensor path: the same.
  temp_dir d2;
  opt.block_index = false;
  opened old(d2.path, opt);
  std::vector<fs::content_ref> old_refs;
  std::vector<bytes> old_served;
  for (int v = 0; v < 4; ++v) {
    old_refs.push_back(old.content.put("run/step_" + std::to_string(v) + ".safetensors",
                                       format::memory_source(bytes(served[std::size_t(v)]))));
    old_served.push_back(read_all(old.content, old_refs.back()));
  }
  REQUIRE(old.content.detail(old_refs[3]).tensors.at(0).mode == "intra");
  old.content.drop_caches();
  for (std::size_t v = old_refs.size(); v-- > 0;) {
    INFO("without a block index, version " << v);
    REQUIRE(same(read_all(old.content, old_refs[v]), old_served[v]));
  }
}
