// format::distcp_walker: a DCP shard (byte items, then one torch archive per tensor) recognised
// archive by archive while it is written, checked against recognise() of the finished file, and
// stopping where the recogniser makes the rest opaque.
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>

#include "codec/error.hpp"
#include "codec/format/distcp_stream.hpp"
#include "codec/format/recognise.hpp"
#include "format_test_util.hpp"

using namespace ckpt::format;
using namespace ckpt::format::test;

namespace {

using bytes = std::vector<std::byte>;

// torch.save of one tensor of n floats valued `v` (torch 1.13's records, or the newest's with
// .format_version and byteorder first).
bytes tensor_archive(int n, float v, bool newest = false) {
  pickle_writer p;
  p.proto(2).tensor("0", "FloatStorage", n, 0, {n}, {1}).stop();
  zip_writer z;
  z.add("archive/data.pkl", p.out);
  if (newest) {
    z.add("archive/.format_version", bytes_of("1"));
    z.add("archive/byteorder", bytes_of("little"));
  }
  z.add("archive/data/0", f32_bytes(std::size_t(n), v));
  z.add("archive/version", bytes_of("3\n"));
  return z.finish();
}

// torch.save of an object without tensors: a DCP byte item.
bytes byte_item() {
  pickle_writer p;
  p.proto(2).op('}').stop();
  zip_writer z;
  z.add("archive/data.pkl", p.out);
  z.add("archive/version", bytes_of("3\n"));
  return z.finish();
}

void append(bytes& to, const bytes& b) {
  to.insert(to.end(), b.begin(), b.end());
}

// A file being written: reads past `written` would block (here: fail as a cancelled stream's
// read does, with an io_error), reads past the end of the finished file return zeros there (the
// walker's source contract).
struct growing {
  const bytes& file;
  std::uint64_t written = ~std::uint64_t(0);
  std::uint64_t max_end = 0;  // the furthest byte read inside the file
  source src() {
    return source(std::uint64_t(1) << 40, [this](std::uint64_t off, std::span<std::byte> out) {
      if (off + out.size() > written && written < file.size())
        throw ckpt::io_error(ECANCELED, "read past what is written");
      std::fill(out.begin(), out.end(), std::byte{0});
      if (off < file.size())
        std::memcpy(out.data(), file.data() + off, std::min(out.size(), file.size() - off));
      max_end = std::max(max_end, std::min<std::uint64_t>(off + out.size(), file.size()));
    });
  }
};

// Walks `file` and compares every tensor with recognise()'s; returns the walker's tensors.
// back_to_back: archives follow each other (no gap to search through in windows).
std::vector<tensor_info> walk_and_compare(const bytes& file, bool back_to_back = true) {
  const layout l = recognise(memory_source(file));
  REQUIRE(l.format == file_format::distcp);
  growing g{file};
  const source src = g.src();
  distcp_walker w(src, recognise_options{});
  std::vector<tensor_info> found;
  while (const auto t = w.next()) {
    // Nothing of a tensor's payload is read before the walk returns it: at most the headers
    // and a small window past them.
    if (back_to_back) CHECK(g.max_end <= t->offset + 4096 + 24);
    found.push_back(*t);
  }
  CHECK(w.complete());
  check_same_tensors(found, l.tensors);
  return found;
}

}  // namespace

TEST_CASE("distcp stream: byte items then tensors, as FileSystemWriter writes",
          "[format][stream]") {
  for (const bool newest : {false, true}) {
    INFO("newest writer " << newest);
    bytes f;
    append(f, byte_item());
    append(f, byte_item());
    for (int k = 0; k < 5; ++k) append(f, tensor_archive(4096 >> k, float(k), newest));
    const auto found = walk_and_compare(f);
    REQUIRE(found.size() == 5);
    CHECK(found[0].name == "item2/data/0");  // byte items count as archives
    CHECK(found[4].name == "item6/data/0");
  }
}

TEST_CASE("distcp stream: raw bytes before and between archives are skipped as the recogniser does",
          "[format][stream]") {
  bytes f = bytes_of(std::string(10000, 'b'));  // raw byte items
  append(f, tensor_archive(2048, 1));
  append(f, bytes_of(std::string(300, 'g')));  // garbage between two archives
  append(f, tensor_archive(1024, 2));
  append(f, bytes_of(std::string(50, 't')));  // and after the last
  const auto found = walk_and_compare(f, false);
  CHECK(found.size() == 2);
}

TEST_CASE("distcp stream: the walk waits for headers only, in file order", "[format][stream]") {
  bytes f;
  append(f, byte_item());
  for (int k = 0; k < 3; ++k) append(f, tensor_archive(8192, float(k)));
  const layout l = recognise(memory_source(f));
  REQUIRE(l.tensors.size() == 3);
  // Written up to a little past each tensor's local header (data.pkl's descriptor is searched
  // for in 4 KiB windows): the walk returns that tensor, and the next one waits.
  for (std::size_t i = 0; i < l.tensors.size(); ++i) {
    growing g{f, l.tensors[i].offset + 8192};
    const source src = g.src();
    distcp_walker w(src, recognise_options{});
    for (std::size_t j = 0; j <= i; ++j) {
      const auto t = w.next();
      REQUIRE(t);
      CHECK(t->offset == l.tensors[j].offset);
    }
    CHECK_THROWS_AS(w.next(), ckpt::io_error);  // the next read would wait
  }
}

TEST_CASE("distcp stream: stops where the rest of the shard is opaque", "[format][stream]") {
  SECTION("an archive cut in the middle: the tensors before it") {
    bytes f;
    append(f, tensor_archive(2048, 1));
    bytes cut = tensor_archive(2048, 2);
    cut.resize(cut.size() / 2);
    append(f, cut);
    append(f, tensor_archive(2048, 3));
    const layout l = recognise(memory_source(f));
    growing g{f};
    const source src = g.src();
    distcp_walker w(src, recognise_options{});
    std::vector<tensor_info> found;
    while (const auto t = w.next()) found.push_back(*t);
    // The recogniser keeps the first archive and makes the rest opaque; the walk may also
    // have found the cut archive's header (the commit then stores the file whole), never more.
    REQUIRE(l.format == file_format::distcp);
    REQUIRE(l.tensors.size() == 1);
    REQUIRE(found.size() >= 1);
    CHECK(found.size() <= 2);
    CHECK(found[0].offset == l.tensors[0].offset);
    if (found.size() == 2) CHECK_FALSE(w.complete());
    CHECK(found.size() == 2);  // as this archive is cut: its header and data.pkl are whole
  }
  SECTION("no archive at all") {
    const bytes f = bytes_of(std::string(5000, 'x'));
    growing g{f};
    const source src = g.src();
    distcp_walker w(src, recognise_options{});
    CHECK_FALSE(w.next());
    CHECK(w.archives() == 0);
  }
}

TEST_CASE("distcp stream: an archive at 0 is walked before it is known to be the only one",
          "[format][stream]") {
  SECTION("alone: the recogniser's torch.save file, the walker's one-tensor shard") {
    const bytes f = tensor_archive(4096, 1);
    REQUIRE(recognise(memory_source(f)).format == file_format::torch_zip);
    growing g{f};
    const source src = g.src();
    distcp_walker w(src, recognise_options{});
    const auto t = w.next();
    REQUIRE(t);
    CHECK(t->name == "item0/data/0");
    CHECK_FALSE(w.next());
  }
  SECTION("followed by another: both, in order") {
    bytes f = tensor_archive(4096, 1);
    append(f, tensor_archive(2048, 2));
    const auto found = walk_and_compare(f);
    REQUIRE(found.size() == 2);
    CHECK(found[0].name == "item0/data/0");
  }
}
