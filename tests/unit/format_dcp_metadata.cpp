// DCP's .metadata: the items a real CPython pickle of torch's Metadata holds, and refusal of
// what is not one.
#include <catch2/catch.hpp>

#include <string>

#include "codec/error.hpp"
#include "codec/format/dcp_metadata.hpp"
#include "format_test_util.hpp"

using namespace ckpt::format;
using ckpt::format::test::pickle_writer;

namespace {

std::vector<std::byte> from_hex(std::string_view h) {
  std::vector<std::byte> out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2)
    out.push_back(std::byte(std::stoi(std::string(h.substr(i, 2)), nullptr, 16)));
  return out;
}

// pickle.dumps(tests/fs/dcp_metadata.make(...)) under /usr/bin/python3 3.11 (protocol 4), the
// stand-ins carrying torch 2.x's module, class and field names:
//   ('rank0.state', bytes item, '__0_0.distcp', 0, 700),
//   ('optim.w.exp_avg_sq', chunk (2, 0), '__0_0.distcp', 700, 1500),
//   ('model.w', chunk (2, 0), '__0_0.distcp', 2200, 1500) with transform_descriptors ['zstd'].
const std::vector<std::byte>& cpython_metadata() {
  static const auto bytes = from_hex(
      "800495f6030000000000008c25746f7263682e64697374726962757465642e636865636b706f696e742e6d657461"
      "6461"
      "7461948c084d657461646174619493942981947d94288c1373746174655f646963745f6d65746164617461947d94"
      "288c"
      "0b72616e6b302e73746174659468008c14427974657353746f726167654d657461646174619493942981948c126f"
      "7074"
      "696d2e772e6578705f6176675f73719468008c1554656e736f7253746f726167654d657461646174619493942981"
      "947d"
      "94288c0a70726f706572746965739468008c1054656e736f7250726f706572746965739493942981947d94288c05"
      "6474"
      "797065948c05746f726368948c07666c6f617433329493948c066c61796f7574948c13746f7263682e7365726961"
      "6c69"
      "7a6174696f6e948c0b5f6765745f6c61796f75749493948c0d746f7263682e7374726964656494859452948c0d72"
      "6571"
      "75697265735f6772616494898c0d6d656d6f72795f666f726d6174948c0c746f7263682e5f7574696c73948c1774"
      "6f72"
      "63682e636f6e746967756f75735f666f726d61749493948c0a70696e5f6d656d6f7279948975628c0473697a6594"
      "8c05"
      "746f726368948c0453697a659493944b044b048694859452948c066368756e6b73945d9468008c144368756e6b53"
      "746f"
      "726167654d657461646174619493942981947d94288c076f6666736574739468294b024b008694859452948c0573"
      "697a"
      "65739468294b044b0486948594529475626175628c076d6f64656c2e7794680d2981947d9428681068122981947d"
      "9428"
      "681568186819681f682089682168246825897562682668294b044b04869485945294682d5d9468302981947d9428"
      "6833"
      "68294b024b00869485945294683768294b044b048694859452947562617562758c0c706c616e6e65725f64617461"
      "944e"
      "8c0c73746f726167655f64617461947d942868008c0d4d65746164617461496e6465789493942981947d94288c03"
      "6671"
      "6e9468078c05696e646578944e8c066f6666736574944e75628c27746f7263682e64697374726962757465642e63"
      "6865"
      "636b706f696e742e66696c6573797374656d948c0c5f53746f72616765496e666f9493942981947d94288c0d7265"
      "6c61"
      "746976655f70617468948c0c5f5f305f302e6469737463709468554b008c066c656e677468944dbc027562685029"
      "8194"
      "7d94286853680b68544b00685568294b024b00869485945294756268582981947d9428685b685c68554dbc02685d"
      "4ddc"
      "05756268502981947d94286853683b68544b00685568294b024b00869485945294756268582981947d9428685b68"
      "5c68"
      "554d9808685d4ddc058c157472616e73666f726d5f64657363726970746f7273945d948c047a7374649461756275"
      "8c0c"
      "73746f726167655f6d657461944e75622e");
  return bytes;
}

}  // namespace

TEST_CASE("dcp metadata of a CPython pickle names each item's file and range", "[format][dcp]") {
  const auto read = read_dcp_metadata(cpython_metadata());
  REQUIRE(read);
  const auto& items = *read;
  REQUIRE(items.size() == 2);  // the transformed item is left out
  CHECK(items[0].fqn == "rank0.state");
  CHECK(items[0].relative_path == "__0_0.distcp");
  CHECK(items[0].offset == 0);
  CHECK(items[0].length == 700);
  CHECK(items[1].fqn == "optim.w.exp_avg_sq");
  CHECK(items[1].offset == 700);
  CHECK(items[1].length == 1500);
}

TEST_CASE("dcp metadata keeps the class of objects made by NEWOBJ", "[format][dcp]") {
  const auto g = load_pickle_graph(cpython_metadata());
  CHECK(g.at(g.root).k == pickle_graph::kind::object);
  CHECK(g.class_name(g.at(g.root)) == "torch.distributed.checkpoint.metadata\nMetadata");
}

TEST_CASE("dcp metadata refuses every cut of the pickle", "[format][dcp]") {
  const auto& full = cpython_metadata();
  for (std::size_t n = 0; n < full.size(); ++n) {
    const std::span<const std::byte> cut(full.data(), n);
    CHECK_THROWS_AS(read_dcp_metadata(cut), ckpt::corrupt_error);
  }
}

namespace {

// A Metadata of one storage_data entry (as CPython pickles dataclasses: NEWOBJ, BUILD): fqn ->
// _StorageInfo with `fields` (name, value; a field left out is not written), the entry named
// `repeat` times through the memo.
std::vector<std::byte> one_item(const std::string& fqn,
                                const std::vector<std::pair<std::string, std::int32_t>>& fields,
                                int repeat = 1) {
  pickle_writer p;
  p.proto(4).global("m", "Metadata").op(')').op('\x81').op('}').op('(').str("storage_data");
  p.op('}').op('(');
  p.global("m", "MetadataIndex").op(')').op('\x81').op('}').op('(').str("fqn").str(fqn);
  p.op('u').op('b').binput(1);
  p.global("f", "_StorageInfo").op(')').op('\x81').op('}').op('(');
  p.str("relative_path").str("__0_0.distcp");
  for (const auto& [name, value] : fields) p.str(name).integer(value);
  p.op('u').op('b').binput(2);
  for (int i = 1; i < repeat; ++i) p.binget(1).binget(2);
  p.op('u').op('u').op('b').stop();
  return p.out;
}

}  // namespace

TEST_CASE("dcp metadata passes over other pickles and refuses a broken Metadata", "[format][dcp]") {
  SECTION("a plain dict (another program's .metadata) is not DCP's") {
    pickle_writer p;
    p.proto(4).op('}').op('(').str("x").integer(1).op('u').stop();
    CHECK_FALSE(read_dcp_metadata(p.out));
  }
  SECTION("an object of another class is not DCP's") {
    pickle_writer p;
    p.proto(4).global("m", "Manifest").op(')').op('\x81').op('}').op('(');
    p.str("storage_data").op('N').op('u').op('b').stop();
    CHECK_FALSE(read_dcp_metadata(p.out));
  }
  SECTION("an object without storage_data") {
    pickle_writer p;
    p.proto(4).global("m", "Metadata").op(')').op('\x81').op('}').op('(');
    p.str("planner_data").op('N').op('u').op('b').stop();
    CHECK_THROWS_AS(read_dcp_metadata(p.out), ckpt::corrupt_error);
  }
  SECTION("storage_data whose value lacks an offset") {
    CHECK_THROWS_AS(read_dcp_metadata(one_item("w", {{"length", 10}})), ckpt::corrupt_error);
  }
  SECTION("a negative length") {
    CHECK_THROWS_AS(read_dcp_metadata(one_item("w", {{"offset", 0}, {"length", -1}})),
                    ckpt::corrupt_error);
  }
  SECTION("the same with a valid length is read") {
    const auto read = read_dcp_metadata(one_item("w", {{"offset", 5}, {"length", 10}}));
    REQUIRE(read);
    const auto& items = *read;
    REQUIRE(items.size() == 1);
    CHECK(items[0].fqn == "w");
    CHECK(items[0].offset == 5);
  }
}

// `n` distinct MetadataIndex keys sharing one memoised fqn string, all naming one memoised
// _StorageInfo value: 4000-byte names from a few bytes each.
std::vector<std::byte> shared_name_items(int n) {
  pickle_writer p;
  p.proto(4).global("m", "Metadata").op(')').op('\x81').op('}').op('(').str("storage_data");
  p.op('}').op('(');
  p.global("m", "MetadataIndex").binput(3);
  p.op(')').op('\x81').op('}').op('(').str("fqn").str(std::string(4000, 'w')).binput(1);
  p.op('u').op('b');
  p.global("f", "_StorageInfo").op(')').op('\x81').op('}').op('(');
  p.str("relative_path").str("__0_0.distcp").str("offset").integer(5);
  p.str("length").integer(10).op('u').op('b').binput(2);
  for (int i = 1; i < n; ++i) {
    p.binget(3).op(')').op('\x81').op('}').op('(').str("fqn").binget(1).op('u').op('b');
    p.binget(2);
  }
  p.op('u').op('u').op('b').stop();
  return p.out;
}

TEST_CASE("dcp metadata bounds what memo reuse multiplies", "[format][dcp]") {
  // 10,000 entries of one 4000-byte name: 40 MB of names from a pickle of 200 KB. Refused.
  const auto big = shared_name_items(10'000);
  REQUIRE(big.size() < 300'000);
  CHECK_THROWS_AS(read_dcp_metadata(big), ckpt::corrupt_error);
  // 100 of them are read.
  const auto items = read_dcp_metadata(shared_name_items(100));
  REQUIRE(items);
  CHECK(items->size() == 100);
  // One key object named by many entries is one dict entry, as in Python.
  const auto same_key = read_dcp_metadata(one_item("w", {{"offset", 5}, {"length", 10}}, 100));
  REQUIRE(same_key);
  CHECK(same_key->size() == 1);
}

TEST_CASE("a GLOBAL name past 4 KiB is refused, as STACK_GLOBAL's", "[format][pickle]") {
  pickle_writer p;
  p.proto(2).global("m", std::string(5000, 'n')).op(')').op('R').stop();
  CHECK_THROWS_AS(load_pickle_graph(p.out), ckpt::corrupt_error);
  CHECK_THROWS_AS(scan_torch_pickle(p.out), ckpt::corrupt_error);
  pickle_writer q;
  q.proto(2).global("m", std::string(4000, 'n')).op(')').op('R').stop();
  const auto g = load_pickle_graph(q.out);
  CHECK(g.class_name(g.at(g.root)).size() == 4002);
}
