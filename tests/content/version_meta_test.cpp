// Version metadata: the block index round-trips, metadata written before it existed still
// decodes (with no index, so readers decode whole tensors), and a damaged index is refused
// rather than followed to the wrong bytes.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "codec/error.hpp"
#include "codec/format/layout.hpp"
#include "fs/content/version_meta.hpp"

using namespace ckpt;
using namespace ckpt::fs;
using nlohmann::json;

namespace {

version_meta sample() {
  version_meta m;
  m.size = 4096;
  m.kind = version_kind::keyframe;
  m.layout = format::opaque_layout(4096);
  format::tensor_info t;
  t.name = "w";
  t.type = format::element_type::f32;
  t.shape = {512};
  t.offset = 1024;
  t.length = 2048;
  t.compress = true;
  m.layout.tensors.push_back(t);
  m.layout.format = format::file_format::npy;
  m.layout.segments = {};
  format::finish_layout(m.layout);
  tensor_frame f;
  f.tensor = 0;
  f.data_at = 10;
  f.encoded_bytes = 900;
  f.block_elements = 256;
  f.blocks = {0, 400};
  m.tensors.push_back(f);
  return m;
}

json as_json(const version_meta& m) {
  const auto b = encode_meta(m);
  return json::from_cbor(reinterpret_cast<const std::uint8_t*>(b.data()),
                         reinterpret_cast<const std::uint8_t*>(b.data() + b.size()));
}

version_meta from_json(const json& j) {
  const auto v = json::to_cbor(j);
  return decode_meta(std::span(reinterpret_cast<const std::byte*>(v.data()), v.size()));
}

}  // namespace

TEST_CASE("version_meta: the block index round-trips", "[version_meta]") {
  const version_meta m = from_json(as_json(sample()));
  REQUIRE(m.tensors.size() == 1);
  REQUIRE(m.tensors[0].block_elements == 256);
  REQUIRE(m.tensors[0].blocks == std::vector<std::uint64_t>{0, 400});
}

TEST_CASE("version_meta: metadata without a block index decodes with none", "[version_meta]") {
  json j = as_json(sample());
  j["tensors"][0].erase("be");
  j["tensors"][0].erase("bo");
  const version_meta m = from_json(j);
  REQUIRE(m.tensors[0].blocks.empty());
  REQUIRE(m.tensors[0].block_elements == 0);
  REQUIRE(m.tensors[0].encoded_bytes == 900);
}

TEST_CASE("version_meta: a damaged block index is refused", "[version_meta]") {
  const json good = as_json(sample());
  auto refused = [&](auto edit) {
    json j = good;
    edit(j["tensors"][0]);
    REQUIRE_THROWS_AS(from_json(j), corrupt_error);
  };
  refused([](json& f) { f["bo"] = {0, 400, 300}; });  // not increasing
  refused([](json& f) { f["bo"] = {0, 400, 400}; });  // repeated
  refused([](json& f) { f["bo"] = {8, 400}; });       // does not start at the frame
  refused([](json& f) { f["bo"] = {0, 900}; });       // past the frame's end
  refused([](json& f) { f["be"] = 0; });              // no element count
  refused([](json& f) { f["bo"] = "x"; });            // wrong type
  refused([](json& f) { f["be"] = 128; });            // 512 elements are 4 blocks, not 2
  refused([](json& f) { f["bo"] = {0, 300, 600}; });  // 3 entries for 2 blocks
  refused([](json& f) { f["bo"] = {0}; });            // 1 entry for 2 blocks
  refused([](json& f) { f["y"] = 9; });               // no such dtype
}

TEST_CASE(
    "version_meta: ratio frames and the relative setting round-trip, older metadata has "
    "neither",
    "[version_meta]") {
  version_meta s = sample();
  s.kind = version_kind::delta;
  s.tensors[0].mode = tensor_mode::delta;
  s.tensors[0].ratio = true;
  s.coding.bits = 4;
  s.coding.relative = true;
  s.coding.ratio_bits = 2;
  s.coding.keyframe_bits = 9;
  const json j = as_json(s);
  const version_meta m = from_json(j);
  CHECK(m.tensors[0].ratio);
  CHECK(m.coding.relative);
  CHECK(m.coding.ratio_bits == 2);
  CHECK(m.coding.keyframe_bits == 9);
  json old = j;
  old["tensors"][0].erase("r");
  old["cp"].erase("rl");
  old["cp"].erase("rb");
  old["cp"].erase("kb");
  const version_meta o = from_json(old);
  CHECK_FALSE(o.tensors[0].ratio);
  CHECK_FALSE(o.coding.relative);
  CHECK(o.coding.ratio_bits == 0);
  CHECK(o.coding.keyframe_bits == 0);
}

TEST_CASE("version_meta: a delta frame's error sums round-trip, older metadata has none",
          "[version_meta]") {
  version_meta s = sample();
  s.kind = version_kind::delta;
  s.tensors[0].mode = tensor_mode::delta;
  s.tensors[0].error = codec::error_sums{0.25, 100.0};
  const json j = as_json(s);
  const version_meta m = from_json(j);
  REQUIRE(m.tensors[0].error);
  CHECK(m.tensors[0].error->err == 0.25);
  CHECK(m.tensors[0].error->ref == 100.0);
  CHECK(m.tensors[0].error->relative() == Approx(0.05));
  json old = j;
  old["tensors"][0].erase("ee");
  old["tensors"][0].erase("er");
  CHECK_FALSE(from_json(old).tensors[0].error);
}

TEST_CASE(
    "version_meta: a frame's own rounding bits round-trip, are absent by default, and are "
    "range-checked",
    "[version_meta]") {
  version_meta s = sample();
  s.tensors[0].rounded = true;
  s.coding.keyframe_bits = 12;
  CHECK(as_json(s)["tensors"][0].count("fb") == 0);  // 0: the version's bits, not written
  CHECK(from_json(as_json(s)).tensors[0].round_bits == 0);
  s.tensors[0].round_bits = 6;
  const json j = as_json(s);
  CHECK(j["tensors"][0]["fb"] == 6);
  CHECK(from_json(j).tensors[0].round_bits == 6);
  for (const int bad : {-1, 24}) {
    json x = j;
    x["tensors"][0]["fb"] = bad;
    REQUIRE_THROWS_AS(from_json(x), corrupt_error);
  }
}

namespace {

// sample() with its exact bytes (all but the tensor) held inline.
version_meta inline_sample() {
  version_meta m = sample();
  m.exact_inline = true;
  m.inline_exact.resize(2048);
  for (std::size_t i = 0; i < m.inline_exact.size(); ++i) m.inline_exact[i] = std::byte(i * 7);
  exact_region a, b;
  a.offset = 0;
  a.length = 1024;
  a.data_at = 0;
  b.offset = 3072;
  b.length = 1024;
  b.data_at = 1024;
  m.exact = {a, b};
  return m;
}

}  // namespace

TEST_CASE("version_meta: inline exact bytes round-trip under a key older daemons refuse",
          "[version_meta]") {
  const json j = as_json(inline_sample());
  CHECK_FALSE(j.contains("exact"));  // a daemon from before inline bytes: EIO, not misreading
  CHECK(j.contains("exact_inline"));
  const version_meta m = from_json(j);
  REQUIRE(m.exact_inline);
  CHECK(m.inline_exact == inline_sample().inline_exact);
  REQUIRE(m.exact.size() == 2);
  CHECK(m.exact[1].offset == 3072);
  CHECK(m.exact[1].data_at == 1024);
  CHECK(m.exact[1].blocks.empty());
  const version_meta blocks = from_json(as_json(sample()));
  CHECK_FALSE(blocks.exact_inline);
}

TEST_CASE("version_meta: inline exact regions that do not tile their bytes are refused",
          "[version_meta]") {
  const json good = as_json(inline_sample());
  auto refused = [&](auto edit) {
    json j = good;
    edit(j);
    REQUIRE_THROWS_AS(from_json(j), corrupt_error);
  };
  refused([](json& j) { j["exact_inline"][1]["at"] = 1000; });  // not back to back
  refused([](json& j) { j["exact_inline"][1]["l"] = 2000; });   // past the bytes
  refused([](json& j) { j["exact_inline"][1]["o"] = 500; });    // overlaps the first
  refused([](json& j) { j["exact_inline"][1]["o"] = 4000; });   // past the file
  refused([](json& j) { j.erase("xb"); });                      // no bytes
  refused([](json& j) { j["xb"] = json::binary({1, 2, 3}); });  // fewer bytes
  refused([](json& j) { j["exact_inline"].erase(1); });         // bytes beyond the regions
}
