// The data.pkl scanner: storages, names, shapes, memo tracking, protocols, hostile pickles.
#include <catch2/catch.hpp>

#include "codec/error.hpp"
#include "codec/format/pickle_scan.hpp"
#include "format_test_util.hpp"

using namespace ckpt::format;
using ckpt::format::test::pickle_writer;

namespace {

// {'w': tensor over storage 0 (f32 x 12, shape 3x4), 'v': view of storage 0, 'i': int64 scalar}
std::vector<std::byte> state_dict_pickle() {
  pickle_writer p;
  p.proto(2).op('}').binput(0).op('(');
  p.str("w").tensor("0", "FloatStorage", 12, 0, {3, 4}, {4, 1});
  p.str("v").tensor("0", "FloatStorage", 12, 4, {4}, {1});
  p.str("i").tensor("1", "LongStorage", 1, 0, {}, {});
  p.op('u').stop();
  return p.out;
}

}  // namespace

TEST_CASE("pickle scan finds storages, names, shapes and views", "[format][pickle]") {
  const auto r = scan_torch_pickle(state_dict_pickle());
  REQUIRE(r.protocol == 2);
  REQUIRE(r.storages.size() == 2);
  CHECK(r.storages[0].key == "0");
  CHECK(r.storages[0].type_name == "FloatStorage");
  CHECK(r.storages[0].numel == 12);
  CHECK(r.storages[0].names == std::vector<std::string>{"w", "v"});
  CHECK(r.storages[0].shape == std::vector<std::uint64_t>{3, 4});
  CHECK(r.storages[1].type_name == "LongStorage");
  CHECK(r.storages[1].names == std::vector<std::string>{"i"});
  CHECK(r.storages[1].shape.empty());  // a scalar: shape () covers 1 element
}

TEST_CASE("pickle scan tracks the memo (BINPUT/BINGET) like torch's second tensor",
          "[format][pickle]") {
  pickle_writer p;
  p.proto(2).op('}').binput(0).op('(');
  p.str("a").global("torch._utils", "_rebuild_tensor_v2").binput(1);
  p.op('(').op('(').str("storage").binput(2).global("torch", "HalfStorage").binput(3);
  p.str("0").str("cpu").binput(4).integer(8).op('t').op('Q');
  p.integer(0).integer(8).op('\x85').integer(1).op('\x85').op('\x89');
  p.global("collections", "OrderedDict").binput(5).op(')').op('R').op('t').op('R');
  // second tensor: everything repeated through the memo
  p.str("b").binget(1).op('(').op('(').binget(2).binget(3).str("1").binget(4).integer(2);
  p.op('t').op('Q').integer(0).integer(2).op('\x85').integer(1).op('\x85').op('\x89');
  p.binget(5).op(')').op('R').op('t').op('R');
  p.op('u').stop();
  const auto r = scan_torch_pickle(p.out);
  REQUIRE(r.storages.size() == 2);
  CHECK(r.storages[1].type_name == "HalfStorage");
  CHECK(r.storages[1].numel == 2);
  CHECK(r.storages[1].names == std::vector<std::string>{"b"});
}

TEST_CASE("pickle scan handles protocol 4 framing, STACK_GLOBAL and MEMOIZE", "[format][pickle]") {
  pickle_writer p;
  p.proto(4).op('\x95');
  ckpt::format::test::put(p.out, std::uint64_t(0));  // FRAME length: framing only
  p.op('}').op('\x94').op('(');
  p.short_str("x").short_str("torch._utils").short_str("_rebuild_tensor_v2").op('\x93').op('\x94');
  p.op('(').op('(').short_str("storage").short_str("torch").short_str("BFloat16Storage");
  p.op('\x93').short_str("0").short_str("cpu").integer(6).op('t').op('Q');
  p.integer(0).integer(2).integer(3).op('\x86').integer(3).integer(1).op('\x86').op('\x89');
  p.op('}').op('t').op('R');  // backward hooks as an empty dict
  p.op('u').stop();
  const auto r = scan_torch_pickle(p.out);
  REQUIRE(r.protocol == 4);
  REQUIRE(r.storages.size() == 1);
  CHECK(r.storages[0].type_name == "BFloat16Storage");
  CHECK(r.storages[0].shape == std::vector<std::uint64_t>{2, 3});
  CHECK(r.storages[0].names == std::vector<std::string>{"x"});
}

TEST_CASE("pickle scan names nested dicts and lists by key path", "[format][pickle]") {
  pickle_writer p;
  p.proto(2).op('}').op('(').str("state").op('}').op('(').integer(3).op('}').op('(');
  p.str("exp_avg").tensor("0", "FloatStorage", 4, 0, {4}, {1});
  p.op('u').op('u').str("list").op(']').op('(');
  p.tensor("1", "FloatStorage", 2, 0, {2}, {1});
  p.op('e').op('u').stop();
  const auto r = scan_torch_pickle(p.out);
  REQUIRE(r.storages.size() == 2);
  CHECK(r.storages[0].names == std::vector<std::string>{"state.3.exp_avg"});
  CHECK(r.storages[1].names == std::vector<std::string>{"list.0"});
}

TEST_CASE("pickle scan refuses unknown opcodes, truncation and bad protocols", "[format][pickle]") {
  pickle_writer bad;
  bad.proto(2).op('}').op('\xff').stop();
  CHECK_THROWS_AS(scan_torch_pickle(bad.out), ckpt::corrupt_error);
  pickle_writer p6;
  p6.proto(6).op('}').stop();
  CHECK_THROWS_AS(scan_torch_pickle(p6.out), ckpt::corrupt_error);
  const auto good = state_dict_pickle();
  for (std::size_t n = 0; n < good.size(); ++n) {
    const std::vector<std::byte> cut(good.begin(), good.begin() + std::ptrdiff_t(n));
    CHECK_THROWS_AS(scan_torch_pickle(cut), ckpt::corrupt_error);
  }
}

TEST_CASE("pickle scan survives deep nesting, cycles and memo abuse within limits",
          "[format][pickle]") {
  SECTION("a million marks hit the stack limit") {
    pickle_writer p;
    p.proto(2);
    for (int i = 0; i < 1000000; ++i) p.op('(');
    CHECK_THROWS_AS(scan_torch_pickle(p.out), ckpt::corrupt_error);
  }
  SECTION("60000 nested lists: linear work, bounded naming depth") {
    pickle_writer p;
    p.proto(2);
    for (int i = 0; i < 60000; ++i) p.op(']');
    p.tensor("0", "FloatStorage", 1, 0, {1}, {1});
    for (int i = 0; i < 60000; ++i) p.op('a');
    p.stop();
    const auto r = scan_torch_pickle(p.out);
    REQUIRE(r.storages.size() == 1);
    CHECK(r.storages[0].names.empty());  // deeper than the naming limit
  }
  SECTION("a list containing itself") {
    pickle_writer p;
    p.proto(2).op(']').binput(0).binget(0).op('a').stop();
    CHECK_NOTHROW(scan_torch_pickle(p.out));
  }
  SECTION("exponential sharing stays linear") {
    pickle_writer p;
    p.proto(2).op(']');
    for (int i = 0; i < 200; ++i) p.op('2').op('\x86');  // x = (x, x)
    p.stop();
    CHECK_NOTHROW(scan_torch_pickle(p.out));
  }
  SECTION("a memo miss is a refusal") {
    pickle_writer p;
    p.proto(2).binget(7).stop();
    CHECK_THROWS_AS(scan_torch_pickle(p.out), ckpt::corrupt_error);
  }
  SECTION("node limit") {
    pickle_writer p;
    p.proto(2).op('(');
    for (int i = 0; i < 5000; ++i) p.op('N');
    p.op('l').stop();
    pickle_limits lim;
    lim.max_nodes = 1000;
    CHECK_THROWS_AS(scan_torch_pickle(p.out, lim), ckpt::corrupt_error);
  }
  SECTION("one storage declared with two sizes is inconsistent") {
    pickle_writer p;
    p.proto(2).op('(');
    p.tensor("0", "FloatStorage", 4, 0, {4}, {1});
    p.tensor("0", "FloatStorage", 5, 0, {5}, {1});
    p.op('l').stop();
    CHECK_THROWS_AS(scan_torch_pickle(p.out), ckpt::corrupt_error);
  }
}
