// torch.save zips and npz through the zip walker, recognition and served-file assembly.
#include <catch2/catch.hpp>
#include <random>

#include "codec/error.hpp"
#include "codec/format/assemble.hpp"
#include "codec/format/recognise.hpp"
#include "format_test_util.hpp"

using namespace ckpt::format;
using namespace ckpt::format::test;

namespace {

struct torch_file {
  std::vector<std::byte> bytes;
  std::uint64_t w_at = 0, i_at = 0;
};

// Like torch 1.13: data.pkl, data/0 (f32 x 1024, 32x32), data/1 (i64 x 1), data/2 (empty), version.
torch_file make_torch(bool zero_crc = false) {
  pickle_writer p;
  p.proto(2).op('}').op('(');
  p.str("w").tensor("0", "FloatStorage", 1024, 0, {32, 32}, {32, 1});
  p.str("w_row").tensor("0", "FloatStorage", 1024, 32, {32}, {1});
  p.str("i").tensor("1", "LongStorage", 1, 0, {}, {});
  p.str("e").tensor("2", "FloatStorage", 0, 0, {0}, {1});
  p.op('u').stop();
  zip_writer z;
  z.zero_crc = zero_crc;
  torch_file f;
  z.add("t/data.pkl", p.out);
  f.w_at = z.add("t/data/0", f32_bytes(1024, 0.5f));
  std::vector<std::byte> one(8);
  one[0] = std::byte(42);
  f.i_at = z.add("t/data/1", one);
  z.add("t/data/2", {});
  z.add("t/version", bytes_of("3\n"));
  f.bytes = z.finish();
  return f;
}

std::vector<std::byte> read_all(const served_file& s) {
  std::vector<std::byte> out(s.size());
  REQUIRE(s.read(0, out) == out.size());
  return out;
}

}  // namespace

TEST_CASE("torch zip: records map to storages, views share one payload", "[format][zip]") {
  const auto f = make_torch();
  recognise_options opt;
  opt.min_compress_bytes = 0;
  const auto l = recognise(memory_source(f.bytes), opt);
  REQUIRE(l.format == file_format::torch_zip);
  REQUIRE(l.tensors.size() == 3);
  const auto& w = l.tensors[0];
  CHECK(w.name == "w");
  CHECK(w.aliases == std::vector<std::string>{"w_row"});
  CHECK(w.type == element_type::f32);
  CHECK(w.shape == std::vector<std::uint64_t>{32, 32});
  CHECK(w.offset == f.w_at);
  CHECK(w.offset % 64 == 0);
  CHECK(w.length == 4096);
  CHECK(w.compress);
  CHECK(l.tensors[1].type == element_type::i64);
  CHECK_FALSE(l.tensors[1].compress);
  CHECK(l.tensors[2].length == 0);
  CHECK_FALSE(l.tensors[2].compress);
  CHECK(l.opaque_bytes() + l.tensor_bytes(true) + l.tensor_bytes(false) == f.bytes.size());
  // The default threshold keeps the 4 KiB payload a candidate and the scalar exact.
  CHECK(recognise(memory_source(f.bytes)).tensors[0].compress);
}

TEST_CASE("assembly serves new payloads with rewritten CRCs, random access", "[format][zip]") {
  const auto f = make_torch();
  recognise_options opt;
  opt.min_compress_bytes = 0;
  const auto src = memory_source(f.bytes);
  const auto l = recognise(src, opt);
  REQUIRE(l.format == file_format::torch_zip);

  SECTION("nothing replaced: byte-identical") {
    CHECK(read_all(make_served_file(l, src, {})) == f.bytes);
  }
  SECTION("replaced payload: descriptor and central directory CRCs follow, local CRC stays 0") {
    std::vector<std::vector<std::byte>> rep(l.tensors.size());
    rep[0] = f32_bytes(1024, -7.25f);
    const auto served = make_served_file(l, src, rep);
    const auto out = read_all(served);
    REQUIRE(out.size() == f.bytes.size());
    const auto want = crc32(0, rep[0]);
    CHECK(std::equal(rep[0].begin(), rep[0].end(), out.begin() + std::ptrdiff_t(f.w_at)));
    std::size_t rewritten = 0;
    for (const auto& fx : l.fixups) {
      const auto& m = l.members[fx.member];
      const auto v = get<std::uint32_t>(out, fx.field_offset);
      if (m.name == "t/data/0") {
        CHECK(v == (fx.original == 0 ? 0u : want));
        rewritten += v == want;
      } else {
        CHECK(v == fx.original);  // members without replaced payloads are untouched
      }
    }
    CHECK(rewritten == 2);  // descriptor + central directory
    // Everything outside the payload and the two CRC fields is unchanged.
    std::size_t diff = 0;
    for (std::size_t k = 0; k < out.size(); ++k) diff += out[k] != f.bytes[k];
    CHECK(diff <= 4096 + 8);
    // Random-access reads of any range agree with the whole-file read.
    std::mt19937_64 rng(1);
    for (int k = 0; k < 2000; ++k) {
      const auto at = rng() % out.size();
      const auto n = std::size_t(1 + rng() % std::min<std::uint64_t>(9000, out.size() - at));
      std::vector<std::byte> part(n);
      REQUIRE(served.read(at, part) == n);
      REQUIRE(std::equal(part.begin(), part.end(), out.begin() + std::ptrdiff_t(at)));
    }
    std::vector<std::byte> past(10);
    CHECK(served.read(out.size(), past) == 0);
    CHECK(served.read(out.size() - 3, past) == 3);
    CHECK(served.member_crc(l.fixups[0].member) != 0);
  }
  SECTION("wrong-size replacement is refused") {
    std::vector<std::vector<std::byte>> rep(l.tensors.size());
    rep[0] = f32_bytes(10, 0);
    CHECK_THROWS_AS(make_served_file(l, src, rep), ckpt::invalid_argument);
  }
}

TEST_CASE("a CRC written as 0 stays 0", "[format][zip]") {
  const auto f = make_torch(/*zero_crc=*/true);
  const auto src = memory_source(f.bytes);
  const auto l = recognise(src);
  REQUIRE(l.format == file_format::torch_zip);
  std::vector<std::vector<std::byte>> rep(l.tensors.size());
  rep[0] = f32_bytes(1024, 3.0f);
  const auto out = read_all(make_served_file(l, src, rep));
  for (const auto& fx : l.fixups) CHECK(get<std::uint32_t>(out, fx.field_offset) == 0);
}

TEST_CASE("npz: stored member's local header CRC is rewritten too", "[format][zip]") {
  const auto a =
      npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (8, 8), }", f32_bytes(64, 1.0f));
  const auto n = npy_file("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
                          std::vector<std::byte>(16, std::byte(1)));
  zip_writer z;
  z.add("a.npy", a, /*descriptor=*/false, /*align=*/false);
  z.add("n.npy", n, false, false);
  const auto bytes = z.finish();
  const auto src = memory_source(bytes);
  recognise_options opt;
  opt.min_compress_bytes = 0;
  const auto l = recognise(src, opt);
  REQUIRE(l.format == file_format::npz);
  REQUIRE(l.tensors.size() == 2);
  CHECK(l.tensors[0].name == "a");
  CHECK(l.tensors[0].compress);
  CHECK_FALSE(l.tensors[1].compress);
  std::vector<std::vector<std::byte>> rep(2);
  rep[0] = f32_bytes(64, 100.0f);
  const auto out = read_all(make_served_file(l, src, rep));
  // The member CRC covers the npy header and the new payload.
  std::vector<std::byte> member(
      out.begin() + std::ptrdiff_t(l.members[0].data_offset),
      out.begin() + std::ptrdiff_t(l.members[0].data_offset + l.members[0].data_length));
  const auto want = crc32(0, member);
  std::size_t seen = 0;
  for (const auto& fx : l.fixups)
    if (fx.member == 0) {
      CHECK(get<std::uint32_t>(out, fx.field_offset) == want);
      ++seen;
    }
  CHECK(seen == 2);  // local header + central directory
}

TEST_CASE("hostile zips become opaque", "[format][zip]") {
  const auto f = make_torch();
  const auto l0 = recognise(memory_source(f.bytes));
  REQUIRE(l0.format == file_format::torch_zip);
  auto opaque = [](const std::vector<std::byte>& b) {
    const auto l = recognise(memory_source(b));
    validate(l);
    return l.format == file_format::opaque && l.file_size == b.size();
  };
  // Central directory entries sit right after the last member's descriptor.
  const auto eocd = f.bytes.size() - 22;
  const auto cd_at = get<std::uint32_t>(f.bytes, eocd + 16);
  SECTION("huge declared sizes") {
    auto b = f.bytes;
    // second CD entry (t/data/0): sizes at +20/+24
    std::uint64_t e = cd_at;
    e += 46 + get<std::uint16_t>(b, e + 28);
    const std::uint32_t huge = 0xfffffff0u;
    std::memcpy(b.data() + e + 20, &huge, 4);
    std::memcpy(b.data() + e + 24, &huge, 4);
    CHECK(opaque(b));
  }
  SECTION("two entries pointing at the same local header overlap") {
    auto b = f.bytes;
    std::uint64_t e = cd_at;
    e += 46 + get<std::uint16_t>(b, e + 28);  // data/0
    const auto lho0 = get<std::uint32_t>(b, e + 42);
    e += 46 + get<std::uint16_t>(b, e + 28);  // data/1
    std::memcpy(b.data() + e + 42, &lho0, 4);
    CHECK(opaque(b));
  }
  SECTION("central directory offset beyond the file") {
    auto b = f.bytes;
    const std::uint64_t far = 1ull << 40;
    std::memcpy(b.data() + eocd - 20 - 56 + 48, &far, 8);  // zip64 end record cd_offset
    CHECK(opaque(b));
  }
  SECTION("descriptor CRC disagreeing with the directory") {
    auto b = f.bytes;
    b[f.w_at + 4096 + 4] ^= std::byte(1);
    CHECK(opaque(b));
  }
  SECTION("payload size disagreeing with the pickle keeps that record opaque") {
    pickle_writer p;
    p.proto(2).op('}').op('(').str("w").tensor("0", "FloatStorage", 1000, 0, {1000}, {1});
    p.op('u').stop();
    zip_writer z;
    z.add("t/data.pkl", p.out);
    z.add("t/data/0", f32_bytes(1024, 0));
    const auto b = z.finish();
    const auto l = recognise(memory_source(b));
    CHECK(l.format == file_format::torch_zip);
    CHECK(l.tensors.empty());
  }
  SECTION("a zip that is neither torch nor npz") {
    zip_writer z;
    z.add("readme.txt", bytes_of("hello"));
    CHECK(opaque(z.finish()));
  }
}

TEST_CASE("newest torch record order: .format_version, .storage_alignment, byteorder",
          "[format][zip]") {
  auto build = [](std::string_view byteorder) {
    pickle_writer p;
    p.proto(2).op('}').op('(');
    for (int k = 0; k < 12; ++k)
      p.str(std::string("t").append(std::to_string(k)))
          .tensor(std::to_string(k), "FloatStorage", 1024, 0, {1024}, {1});
    p.op('u').stop();
    zip_writer z;
    z.add("archive/data.pkl", p.out);
    z.add("archive/.format_version", bytes_of("1"));
    z.add("archive/.storage_alignment", bytes_of("64"));
    z.add("archive/byteorder", bytes_of(byteorder));
    for (int k = 0; k < 12; ++k)  // numeric order 0, 1, 2, ..., 11
      z.add("archive/data/" + std::to_string(k), f32_bytes(1024, float(k)));
    z.add("archive/version", bytes_of("3\n"));
    z.add("archive/.data/serialization_id", bytes_of(std::string(40, '7')));
    return z.finish();
  };
  const auto little = build("little");
  const auto l = recognise(memory_source(little));
  REQUIRE(l.format == file_format::torch_zip);
  REQUIRE(l.tensors.size() == 12);
  for (int k = 0; k < 12; ++k)
    CHECK(l.tensors[std::size_t(k)].name == std::string("t").append(std::to_string(k)));
  CHECK(recognise(memory_source(build("big"))).format == file_format::opaque);
}
