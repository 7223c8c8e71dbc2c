// Content objects (fs/content/content_object.hpp): format 4 (data area first, compressed
// metadata in a trailer, a delta's compressed against its base's exact bytes) is what the store
// writes; formats 1 (metadata first), 2 (metadata not compressed) and 3 (compressed alone) are
// what older stores hold, and must keep reading: as versions on their own, as bases of newer
// deltas, through verify.
#include <zstd.h>

#include <catch2/catch.hpp>
#include <random>

#include "codec/error.hpp"
#include "codec/format/source.hpp"
#include "content_test_util.hpp"
#include "fs/content/content_object.hpp"

using namespace ckpt;
using namespace ckpt::test;

TEST_CASE("format-1 to format-3 content objects (older stores) read the same and serve as bases",
          "[content][format]") {
  temp_dir d;
  fs::content_options opt;
  opt.keyframe_interval = 100;
  std::mt19937_64 rng(21);
  drifting_weights w(600'000, rng), v(3000, rng);
  std::vector<fs::content_ref> refs;
  std::vector<bytes> served;
  const bytes plain(3u << 20, std::byte{0x5a});
  fs::content_ref exact;
  // A keyframe and a delta in format 1, two deltas in format 2, one in format 3, then format 4
  // (the default).
  auto format_at = [](std::size_t step) {
    return step < 2 ? 1u : step < 4 ? 2u : step < 5 ? 3u : 4u;
  };
  for (int step = 0; step < 6; ++step) {
    opt.object_format = format_at(step);
    std::vector<fs::content_ref> live = refs;  // the names of the versions (and the exact file)
    if (exact.version) live.push_back(exact);
    opened s(d.path, opt, live);
    if (step == 0) exact = s.content.put("notes.bin", format::memory_source(plain));
    w.step(rng);
    v.step(rng);
    const bytes file = safetensors({{"w", w.values}, {"v", v.values}});
    refs.push_back(s.content.put("run/step_" + std::to_string(step) + ".safetensors",
                                 format::memory_source(file)));
    CHECK(s.content.info(refs.back()).kind == (step == 0 ? "keyframe" : "delta"));
    served.push_back(read_all(s.content, refs.back()));
    s.journal.sync();
  }
  refs.push_back(exact);
  opened s(d.path, opt, refs);
  // Not vacuous: the objects have the formats they were written in.
  auto format_of = [&](const fs::content_ref& r) {
    std::uint32_t f = 0;
    s.objects.read(s.content.info(r).object, 4, std::as_writable_bytes(std::span(&f, 1)));
    return f;
  };
  for (std::size_t i = 0; i < 6; ++i) CHECK(format_of(refs[i]) == format_at(i));
  CHECK(format_of(exact) == 1u);
  for (std::size_t i = 0; i < 6; ++i) {
    INFO("version " << i);
    s.content.drop_caches();
    REQUIRE(read_all(s.content, refs[i]) == served[i]);
    REQUIRE(s.content.verify(refs[i].version, true, {}).empty());
  }
  REQUIRE(read_all(s.content, exact) == plain);
  REQUIRE(s.content.verify(exact.version, true, {}).empty());
}

namespace {
std::vector<std::byte> as_bytes(const std::string& s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}
}  // namespace

namespace {
// The payload size of object `obj` in the store at `d`.
std::uint64_t object_size(const temp_dir& d, std::uint64_t obj) {
  return bfs::file_size(object_file(d.path, obj)) - 64;  // object framing
}

// The metadata of version r's object, as a reader finds it; `dictionary`: its base's inline
// exact bytes, for a delta whose metadata was compressed against them.
fs::content_header header_of(opened& s, const temp_dir& d, const fs::content_ref& r,
                             std::span<const std::byte> dictionary = {}) {
  const auto obj = s.content.info(r).object;
  return fs::read_content_header(s.objects, store::object_ref{obj, object_size(d, obj)},
                                 [&] { return dictionary; });
}
}  // namespace

TEST_CASE("format 4 stores the metadata compressed, and the store writes it by default",
          "[content][format]") {
  temp_dir d;
  opened s(d.path, {});
  std::mt19937_64 rng(3);
  // Many named tensors: metadata that names them is what compression shrinks.
  std::vector<std::pair<std::string, std::vector<float>>> ts;
  for (int i = 0; i < 40; ++i) {
    drifting_weights w(1500, rng);
    ts.emplace_back("model.layers." + std::to_string(i) + ".weight", w.values);
  }
  const bytes file = safetensors(ts);
  const auto r = s.content.put("m.safetensors", format::memory_source(file));
  const auto obj = s.content.info(r).object;
  std::uint32_t f = 0;
  s.objects.read(obj, 4, std::as_writable_bytes(std::span(&f, 1)));
  REQUIRE(f == 4u);
  // The trailer's metadata length is the frame's; the CBOR it inflates to is several times more.
  std::uint64_t stored = 0;
  s.objects.read(obj, object_size(d, obj) - fs::content_trailer_v4_size,
                 std::as_writable_bytes(std::span(&stored, 1)));
  const auto h = header_of(s, d, r);
  CHECK(h.meta_bytes > 2 * stored);
  CHECK(h.meta->layout.tensors.size() == 40);
  s.content.drop_caches();
  REQUIRE(read_all(s.content, r) == file);
  REQUIRE(s.content.verify(r.version, true, {}).empty());
}

TEST_CASE("metadata frames: round trip, and damaged or oversized frames are refused",
          "[content][format]") {
  const auto cbor = as_bytes(std::string(5000, 'x') + "end");
  const auto z = fs::compress_metadata(cbor);
  CHECK(z.size() < cbor.size() / 10);
  CHECK(fs::inflate_metadata(z, "t") == cbor);
  // A frame that claims more than the cap is refused before any allocation.
  REQUIRE_THROWS_AS(fs::inflate_metadata(z, "t", cbor.size() - 1), ckpt::corrupt_error);
  // Cut frames, and bytes that are no frame.
  for (std::size_t n : {std::size_t(0), std::size_t(3), z.size() / 2, z.size() - 1}) {
    INFO("cut to " << n);
    REQUIRE_THROWS_AS(fs::inflate_metadata(std::span(z).first(n), "t"), ckpt::corrupt_error);
  }
  REQUIRE_THROWS_AS(fs::inflate_metadata(cbor, "t"), ckpt::corrupt_error);
  // A frame that does not record its content size (a streamed compressor's) is refused.
  std::vector<std::byte> nosize(ZSTD_compressBound(cbor.size()));
  ZSTD_CCtx* c = ZSTD_createCCtx();
  REQUIRE(c);
  ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 0);
  const std::size_t n = ZSTD_compress2(c, nosize.data(), nosize.size(), cbor.data(), cbor.size());
  ZSTD_freeCCtx(c);
  REQUIRE(!ZSTD_isError(n));
  nosize.resize(n);
  REQUIRE_THROWS_AS(fs::inflate_metadata(nosize, "t"), ckpt::corrupt_error);
  // Two frames: more bytes than the first frame's recorded size.
  auto twice = z;
  twice.insert(twice.end(), z.begin(), z.end());
  REQUIRE_THROWS_AS(fs::inflate_metadata(twice, "t"), ckpt::corrupt_error);
}

TEST_CASE("a checkpoint's exact bytes go into its metadata, beyond 4 MiB into blocks",
          "[content][format]") {
  temp_dir d;
  opened s(d.path, {});
  std::mt19937_64 rng(5);
  const auto small_tensors = [&](int n) {
    // Tensors under 4 KiB stay exact; one large one is coded.
    std::vector<std::pair<std::string, std::vector<float>>> ts;
    ts.emplace_back("big", drifting_weights(100'000, rng).values);
    for (int i = 0; i < n; ++i)
      ts.emplace_back("small." + std::to_string(i), drifting_weights(800, rng).values);
    return safetensors(ts);
  };
  SECTION("a few KiB of header and small tensors: inline, read and verified from there") {
    const bytes file = small_tensors(20);
    const auto r = s.content.put("a.safetensors", format::memory_source(file));
    const auto h = header_of(s, d, r);
    REQUIRE(h.meta->exact_inline);
    CHECK(h.meta->inline_exact.size() > 20 * 3200);
    CHECK(h.meta->exact.size() >= 2);  // the header and small tensors before and after "big"
    s.content.drop_caches();
    CHECK(read_all(s.content, r) == file);
    CHECK(s.content.verify(r.version, true, {}).empty());
    // A delta's too, and a prune's rewrite of it into a keyframe keeps them.
    const bytes next = small_tensors(20);
    const auto r2 = s.content.put("a.safetensors", format::memory_source(next));
    REQUIRE(s.content.info(r2).kind == "delta");
    CHECK(header_of(s, d, r2, h.meta->inline_exact).meta->exact_inline);
    const auto before = read_all(s.content, r2);
    s.content.rekey(r2.version);
    CHECK(header_of(s, d, r2).meta->exact_inline);
    s.content.drop_caches();
    CHECK(read_all(s.content, r2) == before);
    CHECK(s.content.verify(r2.version, true, {}).empty());
  }
  SECTION("more than 4 MiB of them: blocks in the data area, as before") {
    const bytes file = small_tensors(1400);  // 1400 x 3200 bytes
    const auto r = s.content.put("b.safetensors", format::memory_source(file));
    const auto h = header_of(s, d, r);
    CHECK_FALSE(h.meta->exact_inline);
    CHECK(h.meta->inline_exact.empty());
    s.content.drop_caches();
    CHECK(read_all(s.content, r) == file);
    CHECK(s.content.verify(r.version, true, {}).empty());
  }
}

TEST_CASE(
    "format 4: a delta's metadata is compressed against its base's exact bytes, and still reads "
    "after the base is rewritten",
    "[content][format]") {
  // The same versions into a store writing format 3 and one writing format 4 (the default): a
  // small model's file whose zip-like records (here a safetensors header and small tensors)
  // repeat from version to version.
  temp_dir d3, d4;
  fs::content_options opt;
  opt.keyframe_interval = 100;
  opt.object_format = 3;
  opened s3(d3.path, opt);
  opt.object_format = 4;
  std::vector<fs::content_ref> refs;
  std::vector<bytes> served;
  std::mt19937_64 rng(8);
  std::vector<std::pair<std::string, std::vector<float>>> ts;
  ts.emplace_back("model.weight", drifting_weights(8000, rng).values);
  for (int i = 0; i < 30; ++i)
    ts.emplace_back("model.layers." + std::to_string(i) + ".scale", std::vector<float>(8, 1.0f));
  drifting_weights w(8000, rng);
  {
    opened s4(d4.path, opt);
    for (int step = 0; step < 5; ++step) {
      w.step(rng);
      ts[0].second = w.values;
      const bytes file = safetensors(ts);
      const auto r3 = s3.content.put("run/m.safetensors", format::memory_source(file));
      refs.push_back(s4.content.put("run/m.safetensors", format::memory_source(file)));
      served.push_back(read_all(s4.content, refs.back()));
      REQUIRE(served.back() == read_all(s3.content, r3));
      const auto i3 = s3.content.info(r3), i4 = s4.content.info(refs.back());
      INFO("step " << step << ": format 3 " << i3.stored_bytes << " bytes, format 4 "
                   << i4.stored_bytes);
      if (step == 0) {
        // A keyframe has no base: the same metadata (within a few bytes: its time stamp), 16
        // more bytes of trailer.
        CHECK(i4.stored_bytes + 8 >= i3.stored_bytes + 16);
        CHECK(i4.stored_bytes <= i3.stored_bytes + 24);
      } else {
        REQUIRE(i4.kind == "delta");
        // Its metadata nearly all found in the base's exact bytes.
        CHECK(i4.stored_bytes + 200 < i3.stored_bytes);
      }
    }
    s4.journal.sync();
  }
  // After a restart (nothing cached), again after the base of versions 3-5 became a keyframe
  // (rekey, as rotation rewrites), and after another restart.
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    opened s4(d4.path, opt, refs);
    if (round == 1) REQUIRE(s4.content.rekey(refs[1].version) > 0);
    for (std::size_t i = 0; i < refs.size(); ++i) {
      INFO("version " << i);
      s4.content.drop_caches();
      REQUIRE(read_all(s4.content, refs[i]) == served[i]);
      REQUIRE(s4.content.verify(refs[i].version, true, {}).empty());
    }
    CHECK(s4.content.info(refs[1]).kind == (round == 0 ? "delta" : "keyframe"));
    s4.journal.sync();
  }
  // Read by hand: without the dictionary, or with another version's bytes, the metadata is
  // refused as damage; with the base's exact bytes it is the version's.
  {
    opened s4(d4.path, opt, refs);
    const auto base = header_of(s4, d4, refs[1]);  // a keyframe now: no dictionary
    REQUIRE_FALSE(base.meta->inline_exact.empty());
    const auto h = header_of(s4, d4, refs[2], base.meta->inline_exact);
    CHECK(h.meta->layout.tensors.size() == 31);
    REQUIRE_THROWS_AS(header_of(s4, d4, refs[2]), ckpt::corrupt_error);
    std::vector<std::byte> other = base.meta->inline_exact;
    other[other.size() / 2] ^= std::byte{1};
    REQUIRE_THROWS_AS(header_of(s4, d4, refs[2], other), ckpt::corrupt_error);
    other.pop_back();
    REQUIRE_THROWS_AS(header_of(s4, d4, refs[2], other), ckpt::corrupt_error);
    const auto obj = s4.content.info(refs[2]).object;
    REQUIRE_THROWS_AS(
        fs::read_content_header(s4.objects, store::object_ref{obj, object_size(d4, obj)}),
        ckpt::corrupt_error);
    // The older names go: versions 2-4 stay as hidden bases of version 5, whose metadata and data
    // need them, and read after a restart with nothing cached.
    for (std::size_t i = 0; i + 1 < refs.size(); ++i) s4.content.unref(refs[i]);
    s4.journal.sync();
  }
  opened again(d4.path, opt, {refs.back()});
  CHECK(again.content.info(refs[3]).refs == 0);
  REQUIRE(read_all(again.content, refs.back()) == served.back());
  REQUIRE(again.content.verify(refs.back().version, true, {}).empty());
}

TEST_CASE("metadata frames with a dictionary: round trip, and refused without it",
          "[content][format]") {
  const auto dict = as_bytes(std::string(3000, 'a') + "the previous version's records");
  const auto cbor = as_bytes(std::string(3000, 'a') + "the present version's records");
  const auto alone = fs::compress_metadata(cbor);
  const auto with = fs::compress_metadata(cbor, dict);
  CHECK(with.size() < alone.size());
  CHECK(fs::inflate_metadata(with, "t", fs::max_metadata_bytes, dict) == cbor);
  CHECK(fs::inflate_metadata(alone, "t", fs::max_metadata_bytes, dict) == cbor);
  REQUIRE_THROWS_AS(fs::inflate_metadata(with, "t"), ckpt::corrupt_error);
}
