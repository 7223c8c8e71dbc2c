// safetensors and npy recognition, and refusal of lying headers.
#include <catch2/catch.hpp>

#include "codec/format/assemble.hpp"
#include "codec/format/recognise.hpp"
#include "format_test_util.hpp"

using namespace ckpt::format;
using namespace ckpt::format::test;

namespace {

std::vector<std::byte> safetensors(std::string header, std::size_t data_bytes,
                                   std::int64_t declared_len = -1) {
  while (header.size() % 8) header += ' ';
  std::vector<std::byte> out;
  put(out, std::uint64_t(declared_len < 0 ? header.size() : std::uint64_t(declared_len)));
  put_str(out, header);
  out.resize(out.size() + data_bytes, std::byte(7));
  return out;
}

layout rec(const std::vector<std::byte>& b) {
  recognise_options opt;
  opt.min_compress_bytes = 0;
  auto l = recognise(memory_source(b), opt);
  validate(l);
  return l;
}

}  // namespace

TEST_CASE("safetensors: tensors, dtypes and offsets", "[format][safetensors]") {
  const auto b = safetensors(
      R"({"__metadata__":{"format":"pt"},"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
      R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[16,40]},)"
      R"("h":{"dtype":"BF16","shape":[4],"data_offsets":[40,48]},)"
      R"("z":{"dtype":"F16","shape":[0],"data_offsets":[48,48]}})",
      48);
  const auto l = rec(b);
  REQUIRE(l.format == file_format::safetensors);
  REQUIRE(l.tensors.size() == 4);
  const auto hdr = b.size() - 48;
  CHECK(l.tensors[0].name == "ids");
  CHECK(l.tensors[0].offset == hdr);
  CHECK_FALSE(l.tensors[0].compress);
  CHECK(l.tensors[1].name == "w");
  CHECK(l.tensors[1].shape == std::vector<std::uint64_t>{2, 3});
  CHECK(l.tensors[1].compress);
  CHECK(l.tensors[2].type == element_type::bf16);
  CHECK(l.opaque_bytes() == hdr);
  // Assembly with a replaced payload: no CRCs here, just the bytes.
  std::vector<std::vector<std::byte>> rep(4);
  rep[1] = f32_bytes(6, 9.0f);
  const auto s = make_served_file(l, memory_source(b), rep);
  std::vector<std::byte> out(s.size());
  s.read(0, out);
  CHECK(std::equal(rep[1].begin(), rep[1].end(), out.begin() + std::ptrdiff_t(hdr + 16)));
}

TEST_CASE("safetensors: lying headers are opaque", "[format][safetensors]") {
  const std::string ok = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  CHECK(rec(safetensors(ok, 8)).format == file_format::safetensors);
  CHECK(rec(safetensors(ok, 8, 1ll << 40)).format == file_format::opaque);  // length > file
  CHECK(rec(safetensors(ok, 9)).format == file_format::opaque);             // trailing bytes
  CHECK(rec(safetensors(ok, 4)).format == file_format::opaque);             // truncated
  CHECK(rec(safetensors(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)).format ==
        file_format::opaque);  // shape disagrees
  CHECK(rec(safetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                        12))
            .format == file_format::opaque);  // gap
  CHECK(rec(safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        8))
            .format == file_format::opaque);  // overlap
  CHECK(rec(safetensors(R"({"w":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", 8)).format ==
        file_format::opaque);
  CHECK(rec(safetensors(R"({"w":{"dtype":"F32","shape":[18446744073709551615,2],)"
                        R"("data_offsets":[0,8]}})",
                        8))
            .format == file_format::opaque);  // overflowing shape
  CHECK(rec(safetensors("{not json", 8)).format == file_format::opaque);
  CHECK(rec(safetensors("{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}", 0))
            .format == file_format::opaque);
}

TEST_CASE("npy: versions 1-3, C and Fortran order", "[format][npy]") {
  for (int v : {1, 2, 3}) {
    const auto b = npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 5), }",
                            f32_bytes(20, 0), v);
    const auto l = rec(b);
    REQUIRE(l.format == file_format::npy);
    CHECK(l.tensors[0].shape == std::vector<std::uint64_t>{4, 5});
    CHECK(l.tensors[0].offset == b.size() - 80);
    CHECK(l.tensors[0].compress);
  }
  const auto f = rec(npy_file("{'descr': '<f2', 'fortran_order': True, 'shape': (3, 2), }",
                              std::vector<std::byte>(12)));
  CHECK(f.format == file_format::npy);
  CHECK(f.tensors[0].type == element_type::f16);
  const auto s = rec(npy_file("{'descr': '<i8', 'fortran_order': False, 'shape': (), }",
                              std::vector<std::byte>(8)));
  CHECK(s.format == file_format::npy);
  CHECK_FALSE(s.tensors[0].compress);
}

TEST_CASE("npy: unmodelled or lying headers are opaque", "[format][npy]") {
  const auto d = std::vector<std::byte>(16);
  CHECK(rec(npy_file("{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", d)).format ==
        file_format::opaque);  // big-endian
  CHECK(rec(npy_file("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", d)).format ==
        file_format::opaque);  // object array (a pickle)
  CHECK(rec(npy_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4,), }", d))
            .format == file_format::opaque);  // structured
  CHECK(rec(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", d)).format ==
        file_format::opaque);  // data length disagrees
  CHECK(rec(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), ", d)).format ==
        file_format::opaque);  // unterminated
  auto b = npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", d);
  b[8] = std::byte(0xff), b[9] = std::byte(0xff);  // header length beyond the file
  CHECK(rec(b).format == file_format::opaque);
  b[6] = std::byte(9);  // unknown version
  CHECK(rec(b).format == file_format::opaque);
  CHECK(rec(bytes_of("hello, world")).format == file_format::opaque);
  CHECK(rec({}).format == file_format::opaque);
  CHECK(rec({}).segments.empty());
}
