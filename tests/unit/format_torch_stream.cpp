// format::torch_zip_walker: a torch.save archive recognised record by record while it is written,
// checked against recognise() of the finished file, and refusing what it cannot follow.
#include <catch2/catch.hpp>

#include "codec/error.hpp"
#include "codec/format/recognise.hpp"
#include "codec/format/torch_stream.hpp"
#include "format_test_util.hpp"

using namespace ckpt::format;
using namespace ckpt::format::test;

namespace {

// n float storages named t0..t(n-1) with keys "0".."n-1" (4 KiB each), an int64 step, and the
// records in torch 1.13's order (storages sorted as strings), torch 2.1-2.3's (a byteorder
// record first, storages still sorted as strings) or the newest (.format_version and byteorder
// first, storages in data.pkl's order).
enum class writer { torch_1_13, torch_2_1, newest };
std::vector<std::byte> archive(int n, writer w, std::string_view byteorder = "little") {
  const bool newest = w == writer::newest;
  pickle_writer p;
  p.proto(2).op('}').op('(');
  for (int k = 0; k < n; ++k)
    p.str(std::string("t").append(std::to_string(k)))
        .tensor(std::to_string(k), "FloatStorage", 1024, 0, {1024}, {1});
  p.str("step").tensor(std::to_string(n), "LongStorage", 1, 0, {}, {});
  p.op('u').stop();
  zip_writer z;
  z.add("archive/data.pkl", p.out);
  std::vector<std::string> keys;
  for (int k = 0; k <= n; ++k) keys.push_back(std::to_string(k));
  if (newest) z.add("archive/.format_version", bytes_of("1"));
  if (w != writer::torch_1_13) z.add("archive/byteorder", bytes_of(byteorder));
  if (!newest) std::sort(keys.begin(), keys.end());
  for (const auto& key : keys) {
    if (key == std::to_string(n))
      z.add("archive/data/" + key, std::vector<std::byte>(8, std::byte(7)));
    else
      z.add("archive/data/" + key, f32_bytes(1024, float(std::stoi(key))));
  }
  z.add("archive/version", bytes_of("3\n"));
  return z.finish();
}

// A source over a growing file: reads past `written` fail, as a stream's would block.
struct growing {
  const std::vector<std::byte>& bytes;
  std::uint64_t max_end = 0;  // the furthest byte read
  source src() {
    return source(std::uint64_t(1) << 40, [this](std::uint64_t off, std::span<std::byte> out) {
      if (off + out.size() > bytes.size()) throw ckpt::corrupt_error("read past the file");
      std::memcpy(out.data(), bytes.data() + off, out.size());
      max_end = std::max(max_end, off + out.size());
    });
  }
};

void check_against_recognise(const std::vector<std::byte>& file) {
  const layout l = recognise(memory_source(file));
  REQUIRE(l.format == file_format::torch_zip);
  growing g{file};
  const source src = g.src();
  torch_zip_walker w(src, recognise_options{});
  std::vector<tensor_info> found;
  while (const auto k = w.next()) {
    const tensor_info& t = w.predicted()[*k];
    // Nothing of a record's data is read before the walk reaches the record (a small window
    // past the headers before it at most).
    CHECK(g.max_end <= t.offset + 4096 + 24);
    found.push_back(t);
  }
  check_same_tensors(found, l.tensors);
  // The predicted record order is the layout's order (the lineage signature depends on it).
  const auto order = w.record_order();
  REQUIRE(order.size() == l.tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    CHECK(w.predicted()[order[i]].name == l.tensors[i].name);
}

}  // namespace

TEST_CASE("torch stream: torch 1.13's record order (keys sorted as strings)", "[format][stream]") {
  check_against_recognise(archive(12, writer::torch_1_13));
}

TEST_CASE("torch stream: torch 2.1-2.3's record order (byteorder, keys sorted as strings)",
          "[format][stream]") {
  check_against_recognise(archive(12, writer::torch_2_1));
}

TEST_CASE("torch stream: the newest record order (small records first)", "[format][stream]") {
  check_against_recognise(archive(12, writer::newest));
}

TEST_CASE("torch stream: refuses what it cannot follow", "[format][stream]") {
  SECTION("big-endian payloads") {
    const auto f = archive(3, writer::newest, "big");
    growing g{f};
    const source src = g.src();
    torch_zip_walker w(src, recognise_options{});
    CHECK_THROWS_AS(w.next(), ckpt::corrupt_error);
  }
  SECTION("data.pkl not first") {
    zip_writer z;
    z.add("archive/version", bytes_of("3\n"));
    const auto f = z.finish();
    growing g{f};
    const source src = g.src();
    CHECK_THROWS_AS(torch_zip_walker(src, recognise_options{}), ckpt::corrupt_error);
  }
  SECTION("not a zip") {
    const auto f = bytes_of(std::string(100, 'x'));
    growing g{f};
    const source src = g.src();
    CHECK_THROWS_AS(torch_zip_walker(src, recognise_options{}), ckpt::corrupt_error);
  }
  SECTION("a storage of a type it does not know: its record's size is unknown") {
    pickle_writer p;
    p.proto(2).op('}').op('(');
    p.str("q").tensor("0", "ComplexHalfStorage", 1024, 0, {1024}, {1});
    p.op('u').stop();
    zip_writer z;
    z.add("archive/data.pkl", p.out);
    z.add("archive/data/0", std::vector<std::byte>(4096, std::byte(1)));
    const auto f = z.finish();
    growing g{f};
    const source src = g.src();
    CHECK_THROWS_AS(torch_zip_walker(src, recognise_options{}), ckpt::corrupt_error);
  }
  SECTION("a storage record cut short: the walk fails when it goes on") {
    auto f = archive(3, writer::torch_1_13);
    const layout l = recognise(memory_source(f));
    f.resize(std::size_t(l.tensors[1].offset + 100));  // the second storage is cut
    growing g{f};
    const source src = g.src();
    torch_zip_walker w(src, recognise_options{});
    REQUIRE(w.next());
    REQUIRE(w.next());  // its header is there
    CHECK_THROWS(w.next());
  }
  SECTION("a storage record whose descriptor disagrees with data.pkl") {
    auto f = archive(3, writer::torch_1_13);
    const layout l = recognise(memory_source(f));
    // The descriptor after the first storage names another size.
    const std::uint64_t d = l.tensors[0].offset + l.tensors[0].length;
    REQUIRE(get<std::uint32_t>(f, d) == 0x08074b50);
    f[std::size_t(d + 8)] = std::byte(1);
    growing g{f};
    const source src = g.src();
    torch_zip_walker w(src, recognise_options{});
    REQUIRE(w.next());
    CHECK_THROWS_AS(w.next(), ckpt::corrupt_error);
  }
}
