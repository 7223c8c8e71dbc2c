// Predicted read order of a checkpoint's tensors (what the read path decodes ahead of a reader).
#include <catch2/catch.hpp>
#include <string>

#include "codec/format/read_order.hpp"
#include "codec/format/recognise.hpp"
#include "format_test_util.hpp"

using namespace ckpt::format;
using namespace ckpt::format::test;

TEST_CASE("storage keys are the decimal last path component", "[format][read_order]") {
  CHECK(storage_key("archive/data/17") == 17u);
  CHECK(storage_key("data/0") == 0u);
  CHECK(storage_key("7") == 7u);
  CHECK_FALSE(storage_key("archive/data/"));
  CHECK_FALSE(storage_key("archive/data/1a"));
  CHECK_FALSE(storage_key("archive/data.pkl"));
  CHECK_FALSE(storage_key("archive/data/1234567890123456789"));  // 19 digits: not a key
}

TEST_CASE("torch zips are read in storage-key order, not in file order", "[format][read_order]") {
  // Like torch.save: storages 0..11 pickled in numeric order, records written sorted as strings.
  pickle_writer p;
  p.proto(2).op('}').op('(');
  for (int k = 0; k < 12; ++k)
    p.str("t" + std::to_string(k)).tensor(std::to_string(k), "FloatStorage", 256, 0, {256}, {1});
  p.op('u').stop();
  std::vector<std::string> keys;
  for (int k = 0; k < 12; ++k) keys.push_back(std::to_string(k));
  std::sort(keys.begin(), keys.end());  // "0", "1", "10", "11", "2", ...
  zip_writer z;
  z.add("a/data.pkl", p.out);
  for (const auto& k : keys) z.add("a/data/" + k, f32_bytes(256, float(std::stoi(k))));
  z.add("a/version", bytes_of("3\n"));
  const auto file = z.finish();
  recognise_options opt;
  opt.min_compress_bytes = 0;
  const layout l = recognise(memory_source(file), opt);
  REQUIRE(l.format == file_format::torch_zip);
  REQUIRE(l.tensors.size() == 12);
  CHECK(l.tensors[2].name == "t10");  // file order is string order

  const auto order = read_order(l);
  REQUIRE(order.size() == 12);
  for (std::size_t i = 0; i < order.size(); ++i)
    CHECK(l.tensors[order[i]].name == "t" + std::to_string(i));
}

TEST_CASE("records without a numeric key follow in file order", "[format][read_order]") {
  layout l;
  l.format = file_format::torch_zip;
  for (std::uint64_t i = 0; i < 4; ++i) {
    tensor_info t;
    t.name = "x" + std::to_string(i);
    t.offset = 100 * (i + 1);
    t.length = 10;
    l.tensors.push_back(t);
  }
  l.members = {{"a/data/5", 100, 10, 0}, {"a/data/odd", 200, 10, 0}, {"a/data/2", 300, 10, 0}};
  // tensor 3 (offset 400) has no record at all
  CHECK(read_order(l) == std::vector<std::size_t>{2, 0, 1, 3});
}

TEST_CASE("other formats are read in file order", "[format][read_order]") {
  layout l;
  l.format = file_format::safetensors;
  for (std::uint64_t off : {300u, 100u, 200u}) {
    tensor_info t;
    t.offset = off;
    t.length = 10;
    l.tensors.push_back(t);
  }
  l.members = {{"data/0", 300, 10, 0}};  // ignored outside torch zips
  CHECK(read_order(l) == std::vector<std::size_t>{1, 2, 0});
  CHECK(read_order(layout{}).empty());
}
