// Content objects (fs/content/content_object.hpp): format 2 (data area first, metadata in a
// trailer) is what the store writes; format 1 (metadata first) is what stores before it hold, and
// must keep reading: as versions on their own, as bases of format-2 deltas, through verify.
#include <catch2/catch.hpp>
#include <random>

#include "codec/format/source.hpp"
#include "content_test_util.hpp"
#include "fs/content/content_object.hpp"

using namespace ckpt;
using namespace ckpt::test;

TEST_CASE("format-1 content objects (older stores) read the same and serve as bases",
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
  for (int step = 0; step < 5; ++step) {
    opt.object_format = step < 2 ? 1 : 2;      // a keyframe and a delta in format 1, then format 2
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
  for (std::size_t i = 0; i < 5; ++i) CHECK(format_of(refs[i]) == (i < 2 ? 1u : 2u));
  CHECK(format_of(exact) == 1u);
  for (std::size_t i = 0; i < 5; ++i) {
    INFO("version " << i);
    s.content.drop_caches();
    REQUIRE(read_all(s.content, refs[i]) == served[i]);
    REQUIRE(s.content.verify(refs[i].version, true, {}).empty());
  }
  REQUIRE(read_all(s.content, exact) == plain);
  REQUIRE(s.content.verify(exact.version, true, {}).empty());
}
