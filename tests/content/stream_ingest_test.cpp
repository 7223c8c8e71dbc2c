// Streaming writes (content_store::stream): a torch.save-like archive encoded while it is written
// into the filesystem's write buffer must store exactly what put() stores for the finished file,
// drop its work (and store the file as put() does) when bytes it read are rewritten, decline what
// it cannot stream, and leave nothing behind when cancelled.
#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <thread>

#include "codec/format/recognise.hpp"
#include "codec/quantizer.hpp"
#include "content_test_util.hpp"
#include "fs/content/head_store.hpp"
#include "fs/content/thread_limits.hpp"
#include "fs/namespace/write_buffer.hpp"
#include "tests/unit/format_test_util.hpp"

using namespace ckpt;
using namespace ckpt::test;

namespace {

// torch 1.13's layout: data.pkl, then the storages (keys sorted as strings), then version.
bytes archive(const std::vector<std::vector<float>>& tensors) {
  using namespace ckpt::format::test;
  pickle_writer p;
  p.proto(2).op('}').op('(');
  std::vector<std::string> keys;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const auto n = std::int32_t(tensors[k].size());
    p.str("layer" + std::to_string(k)).tensor(std::to_string(k), "FloatStorage", n, 0, {n}, {1});
    keys.push_back(std::to_string(k));
  }
  p.str("step").tensor(std::to_string(tensors.size()), "LongStorage", 1, 0, {}, {});
  keys.push_back(std::to_string(tensors.size()));
  p.op('u').stop();
  std::sort(keys.begin(), keys.end());
  zip_writer z;
  z.add("archive/data.pkl", p.out);
  for (const auto& key : keys) {
    const std::size_t k = std::size_t(std::stoi(key));
    if (k == tensors.size()) {
      z.add("archive/data/" + key, bytes(8, std::byte(3)));
      continue;
    }
    bytes b(4 * tensors[k].size());
    std::memcpy(b.data(), tensors[k].data(), b.size());
    z.add("archive/data/" + key, b);
  }
  z.add("archive/version", bytes_of("3\n"));
  return z.finish();
}

struct model {
  std::mt19937_64 rng{11};
  std::vector<drifting_weights> layers;
  // Twelve layers and a step counter: 13 storages, so that torch 1.13's record order (keys
  // sorted as strings: 0, 1, 10, 11, 12, 2, ...) differs from data.pkl's.
  model() {
    for (int k = 0; k < 12; ++k) layers.emplace_back(k < 2 ? 200'000 : 20'000, rng);
  }
  bytes step() {
    std::vector<std::vector<float>> t;
    for (auto& l : layers) {
      l.step(rng);
      t.push_back(l.values);
    }
    return archive(t);
  }
};

fs::content_options options(const temp_dir& d) {
  fs::content_options opt;
  opt.heads_dir = (d.path / "heads").string();
  opt.head_min = 1 << 20;
  return opt;
}

std::shared_ptr<fs::write_buffer> fresh_buffer(const temp_dir& d) {
  bfs::create_directories(d.path / "staging");
  // A small budget: most of the file goes to the staging file, as a large checkpoint's does.
  return std::make_shared<fs::write_buffer>(std::make_shared<fs::memory_budget>(1 << 20),
                                            (d.path / "staging").string());
}

// Waits until the stream following `buf` has coded something: a delta's reconstruction is in
// the buffer, or (given the store and its streamed_bytes before the stream started; without
// head images nothing goes into the buffer) a tensor is coded. False after 10 s.
bool coded_something(const fs::write_buffer& buf, const fs::content_store* c = nullptr,
                     std::uint64_t streamed_before = 0) {
  const auto coded = [&] {
    return buf.modified() || (c && c->usage().streamed_bytes > streamed_before);
  };
  for (int i = 0; i < 2000 && !coded(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return coded();
}

// Writes `file` into `buf` in 64 KiB pieces while a stream follows it, then commits.
fs::content_ref stream_in(fs::content_store& c, const std::string& path, const bytes& file,
                          const std::shared_ptr<fs::write_buffer>& buf,
                          const std::function<void()>& before_commit = {}) {
  buf->begin_stream();
  auto s = c.start_stream(path, buf);
  for (std::size_t at = 0; at < file.size(); at += 65536) {
    const std::size_t n = std::min<std::size_t>(65536, file.size() - at);
    buf->write(at, std::span(file).subspan(at, n));
  }
  if (before_commit) before_commit();
  return c.put(path, buf, std::move(s));
}

fs::content_ref plain_put(fs::content_store& c, const temp_dir& d, const std::string& path,
                          const bytes& file) {
  auto buf = fresh_buffer(d);
  buf->write(0, file);
  return c.put(path, buf);
}

// Six versions from `next_file`, streamed where `streamed(v)` and put whole otherwise, into one
// store, against a store of plain puts only: the same kinds (a keyframe, then deltas each on
// the one before), one lineage, and the same served bytes (deterministic coding against the
// same base). `tweak` changes both stores' options; `check` looks at each streamed version.
void check_streamed_matches_plain(
    const std::function<bytes()>& next_file, const std::function<std::string(int)>& path_of,
    const std::function<bool(int)>& streamed_version, const std::string& format,
    const std::function<void(fs::content_options&)>& tweak = {},
    const std::function<void(int, fs::content_store&, const fs::content_ref&)>& check = {}) {
  temp_dir streamed_dir, plain_dir;
  auto so = options(streamed_dir), po = options(plain_dir);
  if (tweak) {
    tweak(so);
    tweak(po);
  }
  opened streamed(streamed_dir.path, so);
  opened plain(plain_dir.path, po);
  std::uint64_t streams = 0;
  for (int v = 0; v < 6; ++v) {
    const bytes file = next_file();
    const std::string path = path_of(v);
    INFO("version " << v);
    fs::content_ref a;
    if (streamed_version(v)) {
      auto buf = fresh_buffer(streamed_dir);
      const std::uint64_t before = streamed.content.usage().streamed_bytes;
      // A delta's stream has coded something before the file is complete: with head images its
      // reconstruction is in the buffer, without them a tensor is coded.
      const fs::content_store* counted = so.heads_dir.empty() ? &streamed.content : nullptr;
      a = stream_in(streamed.content, path, file, buf,
                    [&] { CHECK((v == 0 || coded_something(*buf, counted, before))); });
      ++streams;
    } else {
      a = plain_put(streamed.content, streamed_dir, path, file);
    }
    const auto b = plain_put(plain.content, plain_dir, path, file);
    CHECK(streamed.content.info(a).format == format);
    CHECK(streamed.content.info(a).kind == (v == 0 ? "keyframe" : "delta"));
    CHECK(streamed.content.info(a).base == (v == 0 ? 0 : a.version - 1));
    CHECK(streamed.content.info(a).lineage == 1);
    // A bool first: Catch would print megabytes of both sides.
    const bool same = read_all(streamed.content, a) == read_all(plain.content, b);
    CHECK(same);
    CHECK(streamed.content.usage().streamed_puts == streams);
    if (check) check(v, streamed.content, a);
  }
  CHECK(streamed.content.usage().streams_dropped == 0);
  CHECK(streamed.content.usage().streams_declined == 0);
  CHECK(streamed.content.usage().streams_running == 0);
  CHECK(streamed.content.usage().streamed_bytes > 0);
}

// An options tweak: no head images, and a cache of `cache` bytes.
std::function<void(fs::content_options&)> heads_off(std::uint64_t cache) {
  return [cache](fs::content_options& o) {
    o.heads_dir.clear();
    o.cache_bytes = cache;
  };
}

std::size_t object_files(const temp_dir& d) {
  std::size_t n = 0;
  for (const auto& e : bfs::directory_iterator(d.path / "objects")) n += e.path().extension() != "";
  return n;
}

}  // namespace

TEST_CASE("a streamed put stores what put() stores for the finished file", "[content][stream]") {
  model m;
  check_streamed_matches_plain([&] { return m.step(); },
                               [](int v) { return "run/ckpt_" + std::to_string(v) + ".pt"; },
                               [](int v) { return v % 2 == 1; }, "torch_zip");
}

TEST_CASE("a streamed refresh codes its differences with 4 bits as a put does",
          "[content][stream]") {
  model m;
  check_streamed_matches_plain(
      [&] { return m.step(); }, [](int v) { return "run/ckpt_" + std::to_string(v) + ".pt"; },
      [](int) { return true; }, "torch_zip", [](fs::content_options& o) { o.refresh_interval = 2; },
      [](int v, fs::content_store& c, const fs::content_ref& r) {
        // Deltas 2 and 4 after the keyframe (versions 2 and 4) are refreshes.
        CHECK(c.detail(r).coding.refresh_bits == (v > 0 && v % 2 == 0 ? codec::max_bits : 0));
      });
}

TEST_CASE("a streamed lossy keyframe is rounded as a put rounds it, in the buffer too",
          "[content][stream]") {
  temp_dir streamed_dir, plain_dir;
  auto so = options(streamed_dir), po = options(plain_dir);
  so.keyframe_bits = po.keyframe_bits = 8;
  opened streamed(streamed_dir.path, so);
  opened plain(plain_dir.path, po);
  model m;
  for (int v = 0; v < 3; ++v) {
    const bytes file = m.step();
    const std::string path = "run/ckpt_" + std::to_string(v) + ".pt";
    INFO("version " << v);
    auto buf = fresh_buffer(streamed_dir);
    const auto a = stream_in(streamed.content, path, file, buf);
    const auto b = plain_put(plain.content, plain_dir, path, file);
    CHECK(streamed.content.info(a).kind == (v == 0 ? "keyframe" : "delta"));
    const bytes got = read_all(streamed.content, a);
    CHECK(got == read_all(plain.content, b));
    // The buffer (the head image to be) holds what the version reads as: rounded tensors and
    // the CRC fields that match them.
    bytes in_buffer(file.size());
    buf->read_fully(0, in_buffer);
    CHECK(in_buffer == got);
    if (v == 0) {
      CHECK(got != file);
      CHECK(streamed.content.detail(a).coding.keyframe_bits == 8);
    }
  }
  CHECK(streamed.content.usage().streamed_puts == 3);
  CHECK(streamed.content.usage().streams_dropped == 0);
}

TEST_CASE("without head images, a checkpoint larger than half the cache is streamed",
          "[content][stream]") {
  // Such a checkpoint's reconstruction is not kept in the cache by a commit either: the stream
  // codes it while it is written, against a base decoded through its chain, stores what put()
  // stores and leaves the written bytes as they are (no image to make). One the cache would
  // keep (the next version's base) is left to the commit, which keeps it.
  model m;  // 2.4 MB of tensors a version
  SECTION("larger than half the cache: streamed") {
    check_streamed_matches_plain(
        [&] { return m.step(); }, [](int v) { return "run/ckpt_" + std::to_string(v) + ".pt"; },
        [](int) { return true; }, "torch_zip", heads_off(std::uint64_t(4) << 20));
    temp_dir d;
    auto o = options(d);
    heads_off(std::uint64_t(4) << 20)(o);
    opened s(d.path, o);
    for (int v = 0; v < 3; ++v) {
      const bytes file = m.step();
      auto buf = fresh_buffer(d);
      const auto r = stream_in(s.content, "run/b.pt", file, buf);
      CHECK(s.content.info(r).kind == (v == 0 ? "keyframe" : "delta"));
      CHECK(!buf->modified());
      bytes in_buffer(file.size());
      buf->read_fully(0, in_buffer);
      CHECK((in_buffer == file));  // a bool: Catch would print both sides
    }
    CHECK(s.content.usage().streamed_puts == 3);
    CHECK(s.content.usage().heads == 0);
    CHECK(s.content.usage().cache_bytes < 1'000'000);  // bases decoded through the chain
  }
  SECTION("kept by the cache: streamed, the reconstruction kept there") {
    temp_dir d;
    auto o = options(d);
    heads_off(std::uint64_t(64) << 20)(o);
    opened s(d.path, o);
    for (int v = 0; v < 3; ++v) {
      const std::uint64_t frames = s.content.usage().chunk_frames_decoded;
      const auto r = stream_in(s.content, "run/c.pt", m.step(), fresh_buffer(d));
      CHECK(s.content.info(r).kind == (v == 0 ? "keyframe" : "delta"));
      // The base came from the cache: nothing decoded through the chain.
      CHECK(s.content.usage().chunk_frames_decoded == frames);
    }
    CHECK(s.content.usage().streamed_puts == 3);
    CHECK(s.content.usage().streams_dropped == 0);
    CHECK(s.content.usage().streams_declined == 0);
    // The stream kept the newest reconstruction (2.4 MB) in the cache, as a commit does: the
    // next base.
    CHECK(s.content.usage().cache_bytes >= 2'000'000);
  }
}

TEST_CASE(
    "a kept reconstruction is made over its base's buffer, and the base reads through its chain",
    "[content][stream]") {
  // Without head images a checkpoint the cache holds keeps its reconstruction there as the next
  // base; the next save, streamed or put, takes that buffer over (nothing else holds it) and
  // makes its own reconstruction in it. What every version serves must be what a store whose
  // cache keeps nothing serves (bases decoded through the chain), before and after a restart.
  model m;
  temp_dir kept_dir, chain_dir;
  auto ko = options(kept_dir), co = options(chain_dir);
  heads_off(std::uint64_t(64) << 20)(ko);
  heads_off(std::uint64_t(4) << 20)(co);  // 2.4 MB a version: more than half of it
  std::vector<fs::content_ref> refs;
  std::vector<bytes> served;
  {
    opened kept(kept_dir.path, ko);
    opened chain(chain_dir.path, co);
    for (int v = 0; v < 4; ++v) {
      INFO("version " << v);
      const bytes file = m.step();
      const std::uint64_t before = kept.content.usage().kept_in_place_bytes;
      const auto r = v % 2 ? plain_put(kept.content, kept_dir, "run/c.pt", file)
                           : stream_in(kept.content, "run/c.pt", file, fresh_buffer(kept_dir));
      const auto c = plain_put(chain.content, chain_dir, "run/c.pt", file);
      REQUIRE(kept.content.info(r).kind == (v == 0 ? "keyframe" : "delta"));
      // Every float tensor of a delta (2.4 MB of the file) was made over its base's buffer.
      if (v == 0)
        CHECK(kept.content.usage().kept_in_place_bytes == before);
      else
        CHECK(kept.content.usage().kept_in_place_bytes - before >= 2'000'000);
      served.push_back(read_all(kept.content, r));           // from the cache
      CHECK((served.back() == read_all(chain.content, c)));  // a bool: Catch would print both
      refs.push_back(r);
    }
    CHECK(kept.content.usage().cache_bytes >= 2'000'000);
    // The older versions gave their buffers away: read through their chains now.
    for (std::size_t v = 0; v < refs.size(); ++v)
      CHECK((read_all(kept.content, refs[v]) == served[v]));
    kept.journal.sync();
  }
  opened kept(kept_dir.path, ko, refs);
  for (std::size_t v = 0; v < refs.size(); ++v)
    CHECK((read_all(kept.content, refs[v]) == served[v]));
}

TEST_CASE("a file renamed while a stream follows it joins its new name's lineage",
          "[content][stream]") {
  temp_dir d;
  opened s(d.path, options(d));
  model m;
  const auto first = plain_put(s.content, d, "run/ckpt.pt", m.step());
  // Written as a temporary name (a lineage of its own, its first version a delta on the
  // run's head), renamed to the run's name before its commit.
  auto buf = fresh_buffer(d);
  buf->begin_stream();
  auto st = s.content.start_stream("run/.tmp-x81kq/ckpt.pt", buf);
  const bytes file = m.step();
  buf->write(0, file);
  REQUIRE(coded_something(*buf));
  const auto r = s.content.put("run/ckpt.pt", buf, std::move(st));
  CHECK(s.content.usage().streamed_puts == 1);
  CHECK(s.content.info(r).kind == "delta");
  CHECK(s.content.info(r).base == first.version);
  CHECK(s.content.info(r).lineage == s.content.info(first).lineage);
  // The next save under the name continues from it.
  const auto next = plain_put(s.content, d, "run/ckpt.pt", m.step());
  CHECK(s.content.info(next).base == r.version);
}

TEST_CASE("a stream whose read bytes are rewritten drops its work, the file is stored whole",
          "[content][stream]") {
  temp_dir d;
  opened s(d.path, options(d));
  log_lines log;
  s.content.set_logger(log.sink());
  model m;
  const auto first = stream_in(s.content, "run/a.pt", m.step(), fresh_buffer(d));
  bytes file = m.step();
  const auto l = format::recognise(format::memory_source(file));
  const auto& t0 = l.tensors.at(0);
  auto buf = fresh_buffer(d);
  bytes patch(4096, std::byte(0));  // 1024 zeros over the start of the first tensor
  const auto r = stream_in(s.content, "run/b.pt", file, buf, [&] {
    // Once the stream has coded the first slab (its reconstruction is in the buffer), rewrite
    // bytes it read.
    REQUIRE(coded_something(*buf));
    buf->write(t0.offset, patch);
  });
  CHECK(s.content.usage().streams_dropped == 1);
  CHECK(s.content.usage().streamed_puts == 1);
  CHECK(s.content.info(r).kind == "delta");
  CHECK(s.content.info(r).base == first.version);
  // Stored as the buffer held it at the commit: the rewritten zeros within the codec's
  // closed-loop bound of their base (|got - u| <= |u - base|), the rest as the stream's
  // reconstruction coded once more, so within twice its bound of what was first written.
  auto floats = [&](const bytes& b) {
    std::vector<float> v(t0.length / 4);
    std::memcpy(v.data(), b.data() + t0.offset, t0.length);
    return v;
  };
  const auto got = floats(read_all(s.content, r)), base = floats(read_all(s.content, first)),
             want = floats(file);
  for (std::size_t i = 0; i < 1024; ++i) REQUIRE(std::abs(got[i]) <= std::abs(base[i]) + 1e-6f);
  for (std::size_t i = 1024; i < got.size(); ++i)
    REQUIRE(std::abs(got[i] - want[i]) <= 3 * std::abs(want[i] - base[i]) + 1e-6f);
  CHECK(object_files(d) == 2);  // the dropped stream's object is gone
  // Routine work redone, not a failure: logged at info.
  CHECK(log.count(fs::log_level::info, "streamed encode of run/b.pt dropped") == 1);
  CHECK(log.count(fs::log_level::error) == 0);
}

TEST_CASE("a retired image given back after a newer head was recorded is not rebuilt",
          "[content][stream][heads]") {
  // The stream's file is stored as no version of the lineage, and its base's image is rebuilt
  // from the chain; a save of the lineage's next version may record between the image's return
  // and the rebuild's queueing, its drop of the old head's image finding none. The old head's
  // image must not come back beside the new one's.
  temp_dir d;
  fs::content_options opt = options(d);
  fs::content_store* store = nullptr;
  std::function<void()> in_window;
  opt.test_hooks.before_give_back_rebuild = [&](std::uint64_t) {
    if (in_window) std::exchange(in_window, {})();
  };
  opened s(d.path, opt);
  store = &s.content;
  model m;
  const auto first = stream_in(s.content, "run/a.pt", m.step(), fresh_buffer(d));
  s.content.wait_heads();
  REQUIRE(s.content.info(first).head_bytes == first.size);
  fs::content_ref next;
  in_window = [&] { next = plain_put(*store, d, "run/a.pt", m.step()); };
  auto buf = fresh_buffer(d);
  const bytes file = m.step();
  const auto r = stream_in(s.content, "run/a.pt", file, buf, [&] {
    REQUIRE(coded_something(*buf));
    buf->truncate(file.size() / 2);  // no archive any more: stored as exact bytes
  });
  REQUIRE_FALSE(in_window);
  REQUIRE(s.content.info(r).kind == "exact");
  REQUIRE(s.content.info(next).base == first.version);
  s.content.wait_heads();
  const auto files = fs::head_store::files_in((d.path / "heads").string());
  CHECK(files.count(first.version) == 0);
  CHECK(s.content.info(first).head_bytes == 0);
  CHECK(s.content.info(next).head_bytes == next.size);
}

TEST_CASE("a retired image given back for a lineage that keeps no file is not rebuilt",
          "[content][stream][heads]") {
  // The base's file removed while the stream saved over it, and the stream's file stored as no
  // version of the lineage: the base, now nameless, is a head nobody reads by name. Its rebuild
  // is queued and dropped at once; the job's pin on it, let go, asks to drop the image again,
  // from inside that drop (a deadlock when the job went under the head store's lock).
  temp_dir d;
  opened s(d.path, options(d));
  model m;
  const auto first = stream_in(s.content, "run/a.pt", m.step(), fresh_buffer(d));
  s.content.wait_heads();
  REQUIRE(s.content.info(first).head_bytes == first.size);
  auto buf = fresh_buffer(d);
  const bytes file = m.step();
  const auto r = stream_in(s.content, "run/a.pt", file, buf, [&] {
    REQUIRE(coded_something(*buf));
    s.content.unref(first);          // its name gone
    buf->truncate(file.size() / 2);  // no archive any more: stored as exact bytes
  });
  REQUIRE(s.content.info(r).kind == "exact");
  s.content.wait_heads();
  CHECK(fs::head_store::files_in((d.path / "heads").string()).empty());
  CHECK(s.content.info(first).head_bytes == 0);
  // The base still decodes (a hidden head: the lineage's next save deltas against it).
  CHECK(read_all(s.content, first).size() == first.size);
}

TEST_CASE("a retired image given back while its lineage comes down to one file is not rebuilt",
          "[content][stream][heads]") {
  // The lineage keeps two files (the base, the one before it) while a stream saves; the stream's
  // file is stored as no version of the lineage, and the older file's name goes between the
  // image's return and its rebuild's queueing: the drop that the last other file's going asks
  // for finds no job yet. The rebuilt image would be a second copy of the lineage's one file.
  temp_dir d;
  fs::content_options opt = options(d);
  fs::content_store* store = nullptr;
  std::function<void()> in_window;
  opt.test_hooks.before_give_back_rebuild = [&](std::uint64_t) {
    if (in_window) std::exchange(in_window, {})();
  };
  opened s(d.path, opt);
  store = &s.content;
  model m;
  const auto older = stream_in(s.content, "run/a.pt", m.step(), fresh_buffer(d));
  const auto first = stream_in(s.content, "run/a.pt", m.step(), fresh_buffer(d));
  s.content.wait_heads();
  REQUIRE(s.content.info(first).base == older.version);
  REQUIRE(s.content.info(first).head_bytes == first.size);  // two live files: the image pays
  in_window = [&] { store->unref(older); };
  auto buf = fresh_buffer(d);
  const bytes file = m.step();
  const auto r = stream_in(s.content, "run/a.pt", file, buf, [&] {
    REQUIRE(coded_something(*buf));
    buf->truncate(file.size() / 2);  // no archive any more: stored as exact bytes
  });
  REQUIRE_FALSE(in_window);
  REQUIRE(s.content.info(r).kind == "exact");
  s.content.wait_heads();
  CHECK(fs::head_store::files_in((d.path / "heads").string()).empty());
  CHECK(s.content.info(first).head_bytes == 0);
  CHECK(read_all(s.content, first).size() == first.size);  // its chain still decodes
}

TEST_CASE("a stream reads its base from the retired head image, and a dropped one has it rebuilt",
          "[content][stream][heads]") {
  // The stream retires its base's image (no second image's space while it saves): the base
  // version serves from its chain meanwhile, and gets its image back when the stream's file
  // does not become its lineage's next version.
  temp_dir d;
  opened s(d.path, options(d));
  log_lines log;
  s.content.set_logger(log.sink());
  model m;
  const auto first = stream_in(s.content, "run/a.pt", m.step(), fresh_buffer(d));
  s.content.wait_heads();
  REQUIRE(s.content.info(first).head_bytes == first.size);
  const bytes first_bytes = read_all(s.content, first);
  const auto heads_files = [&] { return fs::head_store::files_in((d.path / "heads").string()); };
  SECTION("stored: the next version's image replaces it") {
    auto buf = fresh_buffer(d);
    const auto r = stream_in(s.content, "run/a.pt", m.step(), buf, [&] {
      REQUIRE(coded_something(*buf));
      CHECK(s.content.info(first).head_bytes == 0);  // retired: no image serves it
      CHECK(heads_files().empty());
      const bool same = read_all(s.content, first) == first_bytes;  // from its chain
      CHECK(same);
    });
    CHECK(s.content.usage().streamed_puts == 2);
    CHECK(s.content.info(r).kind == "delta");
    CHECK(s.content.info(r).base == first.version);
    s.content.wait_heads();
    CHECK(s.content.info(r).head_bytes == r.size);
    CHECK(heads_files().size() == 1);
    const bool same = read_all(s.content, first) == first_bytes;
    CHECK(same);
  }
  SECTION("dropped, and the file stored as no version of the lineage: rebuilt") {
    auto buf = fresh_buffer(d);
    const bytes file = m.step();
    const auto r = stream_in(s.content, "run/a.pt", file, buf, [&] {
      REQUIRE(coded_something(*buf));
      CHECK(s.content.info(first).head_bytes == 0);
      buf->truncate(file.size() / 2);  // no archive any more: stored as exact bytes
    });
    CHECK(s.content.usage().streams_dropped == 1);
    CHECK(s.content.info(r).kind == "exact");
    s.content.wait_heads();
    CHECK(s.content.info(first).head_bytes == first.size);
    CHECK(heads_files().count(first.version) == 1);
    const bool same = read_all(s.content, first) == first_bytes;
    CHECK(same);
    // The lineage's next save is a delta on it, read from the rebuilt image.
    const auto next = stream_in(s.content, "run/a.pt", m.step(), fresh_buffer(d));
    CHECK(s.content.info(next).base == first.version);
    CHECK(log.count(fs::log_level::info, "is rebuilt from its chain") == 1);
  }
  CHECK(log.count(fs::log_level::error) == 0);
}

TEST_CASE("a stream declines what it does not stream, and a cancelled one leaves nothing",
          "[content][stream]") {
  temp_dir d;
  SECTION("not a torch archive: declined, stored by put()") {
    opened s(d.path, options(d));
    std::mt19937_64 rng(3);
    drifting_weights w(600'000, rng);
    const bytes file = safetensors({{"w", w.values}});
    const auto r = stream_in(s.content, "model.safetensors", file, fresh_buffer(d));
    CHECK(read_all(s.content, r) == file);  // the first version: a lossless keyframe
    CHECK(s.content.usage().streamed_puts == 0);
    CHECK(s.content.usage().streams_dropped == 0);
    CHECK(s.content.usage().streams_declined == 1);  // status says so, with the reason
    CHECK(!s.content.usage().last_declined.empty());
  }
  SECTION("below head_min: declined") {
    fs::content_options opt = options(d);
    opt.head_min = 64 << 20;
    opened s(d.path, opt);
    model m;
    stream_in(s.content, "run/a.pt", m.step(), fresh_buffer(d));
    CHECK(s.content.usage().streamed_puts == 0);
    CHECK(s.content.usage().streams_declined == 1);
    CHECK(s.content.usage().last_declined == "smaller than head_min");
  }
  SECTION("past the number of streams the daemon runs at once: declined, stored by put()") {
    opened s(d.path, options(d));
    // Files opened and not written yet: their streams wait for the archive's first bytes.
    std::vector<std::shared_ptr<fs::write_buffer>> bufs;
    std::vector<std::shared_ptr<fs::content_store::stream>> waiting;
    for (std::size_t i = 0; i < fs::kMaxStreams; ++i) {
      bufs.push_back(fresh_buffer(d));
      bufs.back()->begin_stream();
      waiting.push_back(s.content.start_stream("run" + std::to_string(i) + "/a.pt", bufs.back()));
    }
    CHECK(s.content.usage().streams_running == fs::kMaxStreams);
    model m;
    const bytes file = m.step();
    const auto r = stream_in(s.content, "other/a.pt", file, fresh_buffer(d));
    CHECK(read_all(s.content, r) == file);  // a lossless keyframe: stored whole by put()
    CHECK(s.content.usage().streamed_puts == 0);
    CHECK(s.content.usage().streams_declined == 1);
    CHECK(s.content.usage().last_declined.find("streamed already") != std::string::npos);
    CHECK(s.content.usage().streams_running == fs::kMaxStreams);
    waiting.clear();  // their files dropped: cancelled and joined
    CHECK(s.content.usage().streams_running == 0);
    const auto next = stream_in(s.content, "other/a.pt", m.step(), fresh_buffer(d));
    CHECK(s.content.usage().streamed_puts == 1);  // room again: this one streamed
    CHECK(s.content.info(next).base == r.version);
  }
  SECTION("cancelled half-way: no object left, the lineage goes on") {
    opened s(d.path, options(d));
    model m;
    const auto first = stream_in(s.content, "run/a.pt", m.step(), fresh_buffer(d));
    const bytes file = m.step();
    auto buf = fresh_buffer(d);
    buf->begin_stream();
    auto st = s.content.start_stream("run/b.pt", buf);
    buf->write(0, std::span(file).first(file.size() / 2));
    CHECK(coded_something(*buf));
    CHECK(s.content.usage().streams_running == 1);
    st.reset();  // the filesystem dropped the file: cancels and joins
    CHECK(s.content.usage().streams_running == 0);
    CHECK(object_files(d) == 1);
    auto again = fresh_buffer(d);
    again->write(0, file);
    const auto r = s.content.put("run/b.pt", again);
    CHECK(s.content.info(r).kind == "delta");
    CHECK(s.content.info(r).base == first.version);
    CHECK(object_files(d) == 2);
  }
}

namespace {

// torch.save of one tensor (torch 1.13's records); 1-D, or of `rows` rows.
bytes tensor_archive(const std::vector<float>& v, std::int32_t rows = 0) {
  using namespace ckpt::format::test;
  const auto n = std::int32_t(v.size());
  pickle_writer p;
  if (rows)
    p.proto(2).tensor("0", "FloatStorage", n, 0, {rows, n / rows}, {n / rows, 1}).stop();
  else
    p.proto(2).tensor("0", "FloatStorage", n, 0, {n}, {1}).stop();
  zip_writer z;
  z.add("archive/data.pkl", p.out);
  bytes b(4 * v.size());
  std::memcpy(b.data(), v.data(), b.size());
  z.add("archive/data/0", b);
  z.add("archive/version", bytes_of("3\n"));
  return z.finish();
}

// A DCP shard as FileSystemWriter writes it: a byte item (torch.save of an object without
// tensors), then every tensor as its own torch.save, largest first (several writer threads on
// CPU) or smallest first (one thread on GPU).
// `two_d_at`: the tensor written at that position is 2-D (100 rows).
bytes shard(const std::vector<std::vector<float>>& tensors, bool smallest_first = false,
            std::size_t two_d_at = ~std::size_t(0)) {
  using namespace ckpt::format::test;
  pickle_writer p;
  p.proto(2).op('}').stop();
  zip_writer z;
  z.add("archive/data.pkl", p.out);
  z.add("archive/version", bytes_of("3\n"));
  bytes out = z.finish();
  std::vector<const std::vector<float>*> order;
  for (const auto& t : tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [&](auto* a, auto* b) {
    return smallest_first ? a->size() < b->size() : a->size() > b->size();
  });
  for (std::size_t j = 0; j < order.size(); ++j) {
    const bytes a = tensor_archive(*order[j], j == two_d_at ? 100 : 0);
    out.insert(out.end(), a.begin(), a.end());
  }
  return out;
}

// The model's next step as a shard: largest first, or smallest first with a 100-float tensor
// (not compressed: under 4 KiB) first.
bytes shard_step(model& m, bool smallest_first = false) {
  std::vector<std::vector<float>> t;
  for (auto& l : m.layers) {
    l.step(m.rng);
    t.push_back(l.values);
  }
  if (smallest_first) t.push_back(std::vector<float>(100, 0.5f));
  return shard(t, smallest_first);
}

// The floats of `t` in a served file.
std::vector<float> floats_of(const bytes& file, const format::tensor_info& t) {
  std::vector<float> v(t.length / 4);
  std::memcpy(v.data(), file.data() + t.offset, t.length);
  return v;
}

}  // namespace

TEST_CASE("a streamed DCP shard stores what put() stores for the finished shard",
          "[content][stream]") {
  const bool smallest_first = GENERATE(false, true);
  INFO("smallest first " << smallest_first);
  model m;
  check_streamed_matches_plain(
      [&] { return shard_step(m, smallest_first); },
      [](int v) { return "dcp/step_" + std::to_string(v) + "/__0_0.distcp"; },
      [](int v) { return v % 2 == 0; },  // the keyframe too
      "distcp");
}

TEST_CASE("a streamed DCP shard's base: its rank's head, never another rank's or model's",
          "[content][stream]") {
  temp_dir d;
  opened s(d.path, options(d));
  model m;
  const auto first = plain_put(s.content, d, "dcp/step_1/__0_0.distcp", shard_step(m));
  const bytes next = shard_step(m);
  SECTION("a step written under a temporary directory name continues its rank") {
    const auto r = stream_in(s.content, "dcp/.tmp-x81kq/__0_0.distcp", next, fresh_buffer(d));
    CHECK(s.content.usage().streamed_puts == 1);
    CHECK(s.content.info(r).kind == "delta");
    CHECK(s.content.info(r).base == first.version);
  }
  SECTION("another rank starts its own lineage with a keyframe") {
    const auto r = stream_in(s.content, "dcp/step_2/__1_0.distcp", next, fresh_buffer(d));
    CHECK(s.content.usage().streamed_puts == 1);
    CHECK(s.content.info(r).kind == "keyframe");
    CHECK(s.content.info(r).lineage != s.content.info(first).lineage);
  }
  SECTION("a shard below head_min is left to the commit") {
    std::mt19937_64 rng(6);
    std::vector<std::vector<float>> small;
    for (int k = 0; k < 3; ++k) small.push_back(drifting_weights(50'000, rng).values);
    const auto r = stream_in(s.content, "dcp/step_2/__2_0.distcp", shard(small), fresh_buffer(d));
    CHECK(s.content.usage().streamed_puts == 0);
    CHECK(s.content.usage().streams_dropped == 0);
    CHECK(s.content.info(r).format == "distcp");
  }
  SECTION("a single archive is a torch.save file, not a shard: stored whole at the commit") {
    const bytes file = tensor_archive(drifting_weights(600'000, m.rng).values);
    const auto r = stream_in(s.content, "dcp/step_2/__3_0.distcp", file, fresh_buffer(d));
    CHECK(s.content.usage().streamed_puts == 0);
    CHECK(s.content.usage().streams_dropped == 1);  // walked as a shard of one archive
    CHECK(s.content.info(r).format == "torch_zip");
    CHECK(read_all(s.content, r) == file);  // a lossless keyframe: the buffer unchanged
  }
  SECTION("a shard without byte items (its first archive at 0) is streamed") {
    std::vector<std::vector<float>> t;
    for (auto& l : m.layers) t.push_back(l.values);
    bytes file;
    for (const auto& v : t) {
      const bytes a = tensor_archive(v);
      file.insert(file.end(), a.begin(), a.end());
    }
    const auto r = stream_in(s.content, "dcp/step_2/__0_0.distcp", file, fresh_buffer(d));
    CHECK(s.content.usage().streamed_puts == 1);
    CHECK(s.content.info(r).format == "distcp");
  }
  SECTION("a changed model: the tensors after the first that differs are coded without a base") {
    // The next step with the tensor written next-to-last 2-D (same length, another shape):
    // the stream chose its base from the first tensors, which agree. The last tensor agrees
    // again (name, length, shape), but the shard is not the base's model from the changed one
    // on: it is coded without a base too.
    std::vector<std::vector<float>> t;
    for (auto& l : m.layers) {
      l.step(m.rng);
      t.push_back(l.values);
    }
    const bytes file = shard(t, false, 10);
    const auto r = stream_in(s.content, "dcp/step_2/__0_0.distcp", file, fresh_buffer(d));
    CHECK(s.content.usage().streamed_puts == 1);
    CHECK(s.content.info(r).kind == "delta");
    const auto l = format::recognise(format::memory_source(file));
    REQUIRE(l.tensors.size() == 12);
    const bytes got = read_all(s.content, r), base = read_all(s.content, first);
    const auto lb = format::recognise(format::memory_source(base));
    for (std::size_t i = 0; i < l.tensors.size(); ++i) {
      INFO("tensor " << i << " " << l.tensors[i].name);
      const auto want = floats_of(file, l.tensors[i]), read = floats_of(got, l.tensors[i]);
      if (i >= 10) {
        CHECK(read == want);  // no base: a lossless keyframe frame
        continue;
      }
      const auto was = floats_of(base, lb.tensors[i]);
      for (std::size_t e = 0; e < want.size(); ++e)
        REQUIRE(std::abs(read[e] - want[e]) <= std::abs(want[e] - was[e]) + 1e-7f);
    }
  }
  SECTION("a base must hold every tensor walked before the choice, also by shape") {
    // head_min (1 MiB) is reached with the second tensor written, which is 2-D here (same
    // length): the step's base does not hold it, and nothing else is a base.
    std::vector<std::vector<float>> t;
    for (auto& l : m.layers) t.push_back(l.values);
    const auto r =
        stream_in(s.content, "dcp/step_2/__0_0.distcp", shard(t, false, 1), fresh_buffer(d));
    CHECK(s.content.usage().streamed_puts == 1);
    CHECK(s.content.info(r).kind == "keyframe");
  }
  SECTION("another model under the same name is no base") {
    std::mt19937_64 rng(5);
    std::vector<std::vector<float>> other;
    for (int k = 0; k < 3; ++k) other.push_back(drifting_weights(150'000 + k, rng).values);
    const bytes file = shard(other);
    const auto r = stream_in(s.content, "dcp/step_2/__0_0.distcp", file, fresh_buffer(d));
    CHECK(s.content.usage().streamed_puts == 1);
    CHECK(s.content.info(r).kind == "keyframe");
    CHECK(read_all(s.content, r) == file);  // a lossless keyframe
    // The model's next shard still deltas against its own head.
    const auto again = stream_in(s.content, "dcp/step_3/__0_0.distcp", next, fresh_buffer(d));
    CHECK(s.content.info(again).kind == "delta");
    CHECK(s.content.info(again).base == first.version);
  }
}

TEST_CASE("without head images, a DCP shard larger than half the cache is streamed",
          "[content][stream]") {
  // As a torch.save file is (above), with the size known only once the shard's tensors are
  // walked: the stream waits until more than half the cache's budget of compressible bytes is
  // written before it picks a base; a shard that never gets there is left to the commit.
  const bool smallest_first = GENERATE(false, true);
  INFO("smallest first " << smallest_first);
  model m;  // 2.4 MB of tensors a shard
  const auto path_of = [](int v) { return "dcp/step_" + std::to_string(v) + "/__0_0.distcp"; };
  SECTION("larger than half the cache: streamed, stored as put() stores it") {
    check_streamed_matches_plain([&] { return shard_step(m, smallest_first); }, path_of,
                                 [](int) { return true; }, "distcp",
                                 heads_off(std::uint64_t(4) << 20));
    temp_dir d;
    auto o = options(d);
    heads_off(std::uint64_t(4) << 20)(o);
    opened s(d.path, o);
    for (int v = 0; v < 3; ++v) {
      const bytes file = shard_step(m, smallest_first);
      auto buf = fresh_buffer(d);
      const auto r = stream_in(s.content, path_of(v), file, buf);
      CHECK(s.content.info(r).kind == (v == 0 ? "keyframe" : "delta"));
      CHECK(!buf->modified());  // no image to make: the written bytes stay as they are
    }
    CHECK(s.content.usage().streamed_puts == 3);
    CHECK(s.content.usage().heads == 0);
  }
  SECTION("kept by the cache: streamed, the reconstruction kept there") {
    temp_dir d;
    auto o = options(d);
    heads_off(std::uint64_t(64) << 20)(o);
    opened s(d.path, o);
    for (int v = 0; v < 3; ++v) {
      const std::uint64_t frames = s.content.usage().chunk_frames_decoded;
      const auto r =
          stream_in(s.content, path_of(v), shard_step(m, smallest_first), fresh_buffer(d));
      CHECK(s.content.info(r).kind == (v == 0 ? "keyframe" : "delta"));
      CHECK(s.content.info(r).format == "distcp");
      CHECK(s.content.usage().chunk_frames_decoded == frames);  // the base from the cache
    }
    CHECK(s.content.usage().streamed_puts == 3);
    CHECK(s.content.usage().streams_dropped == 0);
    CHECK(s.content.usage().streams_declined == 0);
    CHECK(s.content.usage().cache_bytes >= 2'000'000);  // the newest reconstruction, kept
  }
}

TEST_CASE("a lineage that keeps one file streams as without head images", "[content][stream]") {
  // heads=auto: once the lineage's only live file is its head (each save beside the last, which
  // is then deleted), its saves make no image, from the third on. Their streams then follow
  // heads=off's rule: the written bytes stay as written, and a checkpoint the cache keeps has
  // its reconstruction kept there, the next save's base (a DCP shard's tensors while they fit).
  const int kind = GENERATE(0, 1, 2);  // torch.save; a DCP shard largest, smallest first
  INFO("kind " << kind);
  model m;  // 2.4 MB of tensors a version
  std::uint64_t frames_of_last = 0;
  const auto run = [&](std::uint64_t cache) {
    temp_dir d;
    auto o = options(d);
    o.cache_bytes = cache;
    opened s(d.path, o);
    std::vector<fs::content_ref> refs;
    for (int v = 0; v < 4; ++v) {
      auto buf = fresh_buffer(d);
      const std::string step = std::to_string(v);
      const std::uint64_t frames = s.content.usage().chunk_frames_decoded;
      refs.push_back(
          kind == 0 ? stream_in(s.content, "run/checkpoint-" + step + "/model.pt", m.step(), buf)
                    : stream_in(s.content, "dcp/step_" + step + "/__0_0.distcp",
                                shard_step(m, kind == 2), buf));
      CHECK(s.content.info(refs.back()).kind == (v == 0 ? "keyframe" : "delta"));
      CHECK(s.content.info(refs.back()).format == (kind == 0 ? "torch_zip" : "distcp"));
      // The second's base still had its name at its commit: its image was made.
      if (v == 1) CHECK(buf->modified());
      if (v >= 2) CHECK_FALSE(buf->modified());
      // The 4th save's base, the 3rd (no image), was read from the cache where it fits there.
      if (v == 3) frames_of_last = s.content.usage().chunk_frames_decoded - frames;
      if (v > 0) s.content.unref(refs[std::size_t(v) - 1]);  // rotated: one checkpoint kept
    }
    CHECK(s.content.usage().saves_without_image == 2);
    CHECK(s.content.usage().streams_dropped == 0);
    s.content.wait_heads();
    CHECK(s.content.usage().heads == 0);
    return s.content.usage();
  };
  SECTION("larger than half the cache: streamed") {
    const auto u = run(std::uint64_t(4) << 20);
    CHECK(u.streamed_puts == 4);
    CHECK(u.cache_bytes < 1'000'000);  // bases decoded through the chain
    CHECK(frames_of_last > 0);
  }
  SECTION("kept by the cache: streamed, the reconstruction kept there") {
    const auto u = run(std::uint64_t(64) << 20);
    CHECK(u.streamed_puts == 4);
    CHECK(u.streams_declined == 0);
    CHECK(u.cache_bytes >= 2'000'000);  // the newest reconstruction: the next base
    CHECK(frames_of_last == 0);
  }
}

TEST_CASE("lineages saving in turn keep their reconstructions in the cache while they fit",
          "[content][stream]") {
  // Three lineages (the ranks of one job), each version 2.4 MB: half the cache (12 MiB, of
  // which 6 MiB hold whole tensors) keeps one, the cache not all three. Without images every
  // save is coded while it is written, its reconstruction kept in the cache as a commit keeps
  // it, and a base pushed out by the other ranks' is decoded through its chain a slab at a time:
  // none waits for its commit. Where the ranks save at the same moment, a save whose base was
  // pushed out does not keep its own (it would push out the next rank's). Once one rank saves
  // alone again, its base is back in the cache from its next save on. Torch files and DCP
  // shards, with heads=off and for lineages that keep one file.
  const int kind = GENERATE(0, 1);  // torch.save; a DCP shard, smallest first
  const bool keep_one = GENERATE(false, true);
  const bool at_once = GENERATE(false, true);
  INFO("kind " << kind << ", keep one " << keep_one << ", at once " << at_once);
  temp_dir d, plain_dir;
  auto o = options(d), po = options(plain_dir);
  o.cache_bytes = po.cache_bytes = std::uint64_t(12) << 20;
  if (!keep_one) {
    heads_off(o.cache_bytes)(o);
    heads_off(po.cache_bytes)(po);
  }
  opened s(d.path, o), plain(plain_dir.path, po);
  constexpr int ranks = 3, rounds = 4;
  std::vector<model> models(ranks);
  std::vector<fs::content_ref> last(ranks);
  const auto path_of = [&](int r, int k) {
    const std::string rank = std::to_string(r), step = std::to_string(k);
    return kind == 0 ? "rank" + rank + "/checkpoint-" + step + "/model.pt"
                     : "rank" + rank + "/step_" + step + "/__" + rank + "_0.distcp";
  };
  int saves = 0;
  const auto next_file = [&](int r) {
    auto& m = models[std::size_t(r)];
    return kind == 0 ? m.step() : shard_step(m, true);
  };
  const auto check = [&](int r, int k, const bytes& file, const fs::content_ref& ref) {
    ++saves;
    INFO("round " << k << ", rank " << r);
    CHECK(s.content.info(ref).kind == (k == 0 ? "keyframe" : "delta"));
    if (k > 0) CHECK(s.content.info(ref).base == last[std::size_t(r)].version);
    // What the commit path serves for the same files in the same order.
    const auto want = plain_put(plain.content, plain_dir, path_of(r, k), file);
    const bool same = read_all(s.content, ref) == read_all(plain.content, want);
    CHECK(same);
    if (keep_one && k > 0) s.content.unref(last[std::size_t(r)]);  // rotated: one kept
    last[std::size_t(r)] = ref;
  };
  const auto save = [&](int r, int k) {
    const bytes file = next_file(r);
    check(r, k, file, stream_in(s.content, path_of(r, k), file, fresh_buffer(d)));
  };
  // Every rank's first 1.5 MB (past head_min) before any commit: all three saves are in
  // progress when each stream looks at its base.
  const auto save_at_once = [&](int k) {
    std::vector<bytes> files;
    std::vector<std::shared_ptr<fs::write_buffer>> bufs;
    std::vector<std::shared_ptr<fs::content_store::stream>> streams;
    for (int r = 0; r < ranks; ++r) {
      files.push_back(next_file(r));
      bufs.push_back(fresh_buffer(d));
      bufs.back()->begin_stream();
      streams.push_back(s.content.start_stream(path_of(r, k), bufs.back()));
    }
    // Their starts first (a torch file's data.pkl, which tells its size), as ranks released
    // together write them.
    constexpr std::size_t start = 65'536, first = 1'500'000;
    for (int r = 0; r < ranks; ++r)
      bufs[std::size_t(r)]->write(0, std::span(files[std::size_t(r)]).first(start));
    for (int i = 0; i < 2000 && s.content.usage().large_saves < ranks; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK(s.content.usage().large_saves == ranks);
    for (int r = 0; r < ranks; ++r)
      bufs[std::size_t(r)]->write(start,
                                  std::span(files[std::size_t(r)]).subspan(start, first - start));
    for (int r = 0; r < ranks; ++r) {
      const auto i = std::size_t(r);
      bufs[i]->write(first, std::span(files[i]).subspan(first));
      check(r, k, files[i], s.content.put(path_of(r, k), bufs[i], std::move(streams[i])));
    }
    CHECK(s.content.usage().large_saves == 0);
  };
  std::vector<std::uint64_t> kept_by_round;  // streams_kept_bytes after each round
  for (int k = 0; k < rounds; ++k) {
    for (int r = 0; r < ranks; ++r) {
      if (at_once) {
        save_at_once(k);
        break;
      }
      save(r, k);
    }
    kept_by_round.push_back(s.content.usage().streams_kept_bytes);
    UNSCOPED_INFO("round " << k << ": kept " << kept_by_round.back() << ", not kept "
                           << s.content.usage().streams_not_kept);
  }
  // Rank 0's bases were pushed out by the two others' reconstructions: decoded through the
  // chain. Alone, its next save finds its base decoded into the cache by its stream.
  save(0, rounds);
  const std::uint64_t frames = s.content.usage().chunk_frames_decoded;
  save(0, rounds + 1);
  CHECK(s.content.usage().chunk_frames_decoded == frames);
  const auto u = s.content.usage();
  CHECK(u.streamed_puts == std::uint64_t(saves));
  CHECK(u.streams_declined == 0);
  CHECK(u.streams_dropped == 0);
  CHECK(u.streams_running == 0);
  CHECK(u.cache_bytes <= u.cache_budget);
  // One at a time, each keeps its own whole. At once, saves without their base in the cache
  // keep what has room beside the others' reconstructions: the keyframes fill the cache, and
  // from then on each save frees its base's tensors as it codes against them, which the saves
  // beside it take. The cache cannot hold all three: some save kept only part, but every
  // round keeps some (keeping one file, from the third round on: the first two make images).
  if (at_once) {
    CHECK(u.streams_not_kept >= 1);
    CHECK(u.streams_not_kept <= std::uint64_t(ranks * (keep_one ? rounds - 2 : rounds)));
    for (int k = keep_one ? 2 : 0; k < rounds; ++k) {
      INFO("round " << k);
      CHECK(kept_by_round[std::size_t(k)] > (k ? kept_by_round[std::size_t(k) - 1] : 0));
    }
  } else {
    CHECK(u.streams_not_kept == 0);
  }
}

namespace {

// DCP's .metadata (pickled as CPython pickles torch's dataclasses: NEWOBJ, then BUILD with the
// field dict): each (file, fqn, offset, length).
using dcp_item = std::tuple<std::string, std::string, std::uint64_t, std::uint64_t>;
bytes dcp_metadata(const std::vector<dcp_item>& items) {
  using namespace ckpt::format::test;
  const std::string meta = "torch.distributed.checkpoint.metadata";
  pickle_writer p;
  p.proto(2).global(meta, "Metadata").op(')').op('\x81').op('}').op('(');
  p.str("state_dict_metadata").op('}').str("storage_data").op('}').op('(');
  for (const auto& [file, fqn, off, len] : items) {
    p.global(meta, "MetadataIndex").op(')').op('\x81').op('}').op('(');
    p.str("fqn").str(fqn).op('u').op('b');
    p.global("torch.distributed.checkpoint.filesystem", "_StorageInfo").op(')').op('\x81');
    p.op('}').op('(').str("relative_path").str(file).str("offset").integer(std::int32_t(off));
    p.str("length").integer(std::int32_t(len)).op('u').op('b');
  }
  p.op('u').op('u').op('b').stop();
  return p.out;
}

// A model whose first tensor is a second moment (nonnegative, so its deltas are ratios).
struct adam_like_model : model {
  bytes next_shard() {
    std::vector<std::vector<float>> t;
    for (std::size_t k = 0; k < layers.size(); ++k) {
      layers[k].step(rng);
      if (k == 0)
        for (auto& x : layers[k].values) x = std::abs(x) + 1e-4f;
      t.push_back(layers[k].values);
    }
    return shard(t);
  }
};

std::string fqn_of(std::size_t layer) {
  return layer == 0 ? "optim.state.layer0.exp_avg_sq" : "model.layer" + std::to_string(layer);
}

// The items DCP would write for `file` (a shard of adam_like_model) stored as `name`: the fqn of
// each archive's tensor, its range `shift` bytes off when a test wants it to lie.
std::vector<dcp_item> items_for(const bytes& file, std::int64_t shift = 0,
                                const std::string& name = "__0_0.distcp") {
  const auto layout = format::recognise(format::memory_source(file));
  std::vector<dcp_item> items;
  // Largest first: layers 0 and 1 (200k floats), then 2..11, in the shard's order.
  std::size_t layer = 0;
  for (const auto& t : layout.tensors)
    if (t.compress)
      items.emplace_back(name, fqn_of(layer++), std::uint64_t(std::int64_t(t.offset) + shift),
                         t.length);
  return items;
}

bytes metadata_for(const bytes& file, std::int64_t shift = 0) {
  return dcp_metadata(items_for(file, shift));
}

}  // namespace

TEST_CASE("a DCP shard's tensors take their names from the .metadata beside its base",
          "[content][stream][dcp]") {
  temp_dir d;
  fs::content_options opt = options(d);
  opt.ratio_bits = 1;  // second moments by name: what the names change in the coding
  adam_like_model m;
  const bytes step1 = m.next_shard(), step2 = m.next_shard(), step3 = m.next_shard();
  const auto names_of = [](fs::content_store& c, const fs::content_ref& r) {
    std::vector<std::string> out;
    for (const auto& t : c.detail(r).tensors) out.push_back(t.state_name);
    return out;
  };
  std::vector<std::string> expected;
  for (std::size_t k = 0; k < 12; ++k) expected.push_back(fqn_of(k));

  SECTION("named: the second moment at 1 bit, the names kept along the lineage and a restart") {
    fs::content_ref r2, r3;
    std::uint64_t v_bytes = 0;
    std::string v_name;
    const auto stored_of = [](const fs::version_detail& d, const std::string& name) {
      for (const auto& t : d.tensors)
        if (t.name == name) return t.stored_bytes;
      return std::uint64_t(0);
    };
    {
      opened s(d.path, opt);
      const auto r1 = plain_put(s.content, d, "dcp/step_1/__0_0.distcp", step1);
      CHECK(names_of(s.content, r1) == std::vector<std::string>(12));  // nothing to name it by
      s.content.put("dcp/step_1/.metadata.tmp", format::memory_source(metadata_for(step1)));
      r2 = stream_in(s.content, "dcp/step_2/__0_0.distcp", step2, fresh_buffer(d));
      REQUIRE(s.content.info(r2).kind == "delta");
      CHECK(names_of(s.content, r2) == expected);
      const auto detail = s.content.detail(r2);
      for (const auto& t : detail.tensors)
        if (t.state_name == fqn_of(0)) v_name = t.name;
      v_bytes = stored_of(detail, v_name);
      bool has_v_class = false;
      for (const auto& c : detail.fidelity) has_v_class |= c.name == "exp_avg_sq";
      CHECK(has_v_class);
      // No .metadata for step 2: step 3 takes the names step 2 recorded.
      r3 = plain_put(s.content, d, "dcp/step_3/__0_0.distcp", step3);
      CHECK(names_of(s.content, r3) == expected);
      s.content.wait_heads();
    }
    opened again(d.path, opt, {r2, r3});
    const auto r4 =
        stream_in(again.content, "dcp/step_4/__0_0.distcp", m.next_shard(), fresh_buffer(d));
    CHECK(again.content.info(r4).base == r3.version);
    CHECK(names_of(again.content, r4) == expected);

    // The same step 2 without names codes the second moment at `bits`: more bytes.
    temp_dir d2;
    fs::content_options opt2 = options(d2);
    opt2.ratio_bits = 1;
    opened plain(d2.path, opt2);
    plain_put(plain.content, d2, "dcp/step_1/__0_0.distcp", step1);
    const auto u2 = plain_put(plain.content, d2, "dcp/step_2/__0_0.distcp", step2);
    REQUIRE(plain.content.info(u2).kind == "delta");
    CHECK(names_of(plain.content, u2) == std::vector<std::string>(12));
    CHECK(v_bytes * 2 < stored_of(plain.content.detail(u2), v_name));
  }

  SECTION("a put names from the .metadata too, and one stored before its shard waits for it") {
    opened s(d.path, opt);
    // DCP's sync_files=False: the .metadata can be stored before the shard's version exists.
    s.content.put("dcp/step_1/.metadata.tmp", format::memory_source(metadata_for(step1)));
    plain_put(s.content, d, "dcp/step_1/__0_0.distcp", step1);
    const auto r2 = plain_put(s.content, d, "dcp/step_2/__0_0.distcp", step2);
    REQUIRE(s.content.info(r2).kind == "delta");
    CHECK(names_of(s.content, r2) == expected);
  }

  SECTION("items waiting for their shards: at most 4096 files, the oldest dropped first") {
    opened s(d.path, opt);
    // One .metadata naming 4097 shard files none of which is stored yet. Files are taken in
    // path order, so __0_0 waits longest and is dropped for the last.
    std::vector<dcp_item> items = items_for(step1, 0, "__0_0.distcp");
    for (int r = 1; r <= 4095; ++r)
      items.emplace_back("__" + std::to_string(r) + "_0.distcp", "x", 0, 1);
    const auto last = items_for(step1, 0, "__9999_0.distcp");
    items.insert(items.end(), last.begin(), last.end());
    s.content.put("dcp/step_1/.metadata.tmp", format::memory_source(dcp_metadata(items)));
    for (const std::string rank : {"0", "9999"})
      plain_put(s.content, d, "dcp/step_1/__" + rank + "_0.distcp", step1);
    const auto dropped = plain_put(s.content, d, "dcp/step_2/__0_0.distcp", step2);
    const auto kept = plain_put(s.content, d, "dcp/step_2/__9999_0.distcp", step2);
    REQUIRE(s.content.info(kept).kind == "delta");
    CHECK(names_of(s.content, dropped) == std::vector<std::string>(12));
    CHECK(names_of(s.content, kept) == expected);
  }

  SECTION("optimizer=exact keeps what the names say is optimizer state exact") {
    opt.exact_optimizer = true;
    opened s(d.path, opt);
    plain_put(s.content, d, "dcp/step_1/__0_0.distcp", step1);
    s.content.put("dcp/step_1/.metadata", format::memory_source(metadata_for(step1)));
    const auto r2 = plain_put(s.content, d, "dcp/step_2/__0_0.distcp", step2);
    std::map<std::string, std::string> mode;
    for (const auto& t : s.content.detail(r2).tensors) mode[t.state_name] = t.mode;
    CHECK(mode.at(fqn_of(0)) == "lossless");  // optim.state.layer0.exp_avg_sq
    CHECK(mode.at(fqn_of(1)) != "lossless");  // model.layer1: a delta
    // Its bytes read back exact (the first coded tensor of the shard, largest first).
    const auto layout = format::recognise(format::memory_source(step2));
    const auto v = std::find_if(layout.tensors.begin(), layout.tensors.end(),
                                [](const auto& t) { return t.compress; });
    REQUIRE(v != layout.tensors.end());
    const bool v_exact = floats_of(read_all(s.content, r2), *v) == floats_of(step2, *v);
    CHECK(v_exact);
  }

  SECTION("a changed model: from the first tensor its base lacks, nothing more is named") {
    opened s(d.path, opt);
    plain_put(s.content, d, "dcp/step_1/__0_0.distcp", step1);
    s.content.put("dcp/step_1/.metadata", format::memory_source(metadata_for(step1)));
    // Step 2 with its third archive's tensor 2-D (same length, another shape).
    std::vector<std::vector<float>> t;
    for (auto& l : m.layers) t.push_back(l.values);
    // Streamed: the base is chosen by the first tensors, which agree (a put would see another
    // lineage signature and store a keyframe without a base or names).
    const auto r2 =
        stream_in(s.content, "dcp/step_2/__0_0.distcp", shard(t, false, 2), fresh_buffer(d));
    REQUIRE(s.content.usage().streamed_puts == 1);
    const auto names = names_of(s.content, r2);
    std::size_t named = 0;
    for (const auto& n : names) named += !n.empty();
    CHECK(named == 2);  // the two before it
  }

  SECTION("a .metadata whose ranges do not hold the tensors names none of them") {
    opened s(d.path, opt);
    plain_put(s.content, d, "dcp/step_1/__0_0.distcp", step1);
    s.content.put("dcp/step_1/.metadata", format::memory_source(metadata_for(step1, 64)));
    const auto r2 = plain_put(s.content, d, "dcp/step_2/__0_0.distcp", step2);
    CHECK(names_of(s.content, r2) == std::vector<std::string>(12));
  }

  SECTION("a .metadata of another directory, or not DCP's, names nothing and stores as a file") {
    opened s(d.path, opt);
    plain_put(s.content, d, "dcp/step_1/__0_0.distcp", step1);
    s.content.put("elsewhere/.metadata", format::memory_source(metadata_for(step1)));
    const bytes junk = format::test::bytes_of("\x80\x04not a pickle at all");
    const auto j = s.content.put("dcp/step_1/.metadata", format::memory_source(junk));
    CHECK(read_all(s.content, j) == junk);
    const auto r2 = plain_put(s.content, d, "dcp/step_2/__0_0.distcp", step2);
    CHECK(names_of(s.content, r2) == std::vector<std::string>(12));
  }
}

TEST_CASE("without head images, a stream's base chain rekeyed and reclaimed meanwhile",
          "[content][stream]") {
  // A stream with heads=off decodes its base through the chain a slab at a time while the file
  // arrives. Rotation may rewrite versions of that chain as keyframes and remove the objects
  // below them meanwhile (read_recon_slab's guard keeps them until a decode that started is
  // done): the stream must neither fail (its work dropped) nor code against other bytes. Each
  // round moves the two rewrites to other moments of the stream; its version must be what put()
  // stores in a store without them. (Without the guard five runs in six failed.)
  constexpr int kChain = 8;  // a keyframe and 7 deltas: each slab of the base decodes 8 frames
  int dropped = 0, differ = 0;
  for (int round = 0; round < 20; ++round) {
    INFO("round " << round);
    temp_dir d, p;
    auto o = options(d), po = options(p);
    heads_off(std::uint64_t(4) << 20)(o);
    heads_off(std::uint64_t(4) << 20)(po);
    opened s(d.path, o);
    opened plain(p.path, po);
    model m;  // 2.4 MB of tensors a version: over half of the 4 MiB cache
    std::vector<fs::content_ref> refs;
    for (int v = 0; v < kChain; ++v) {
      const bytes file = m.step();
      const std::string path = "run/ckpt_" + std::to_string(v) + ".pt";
      refs.push_back(plain_put(s.content, d, path, file));
      plain_put(plain.content, p, path, file);
    }
    sync_like_fs(s);
    for (int v = 0; v + 1 < kChain; ++v) s.content.unref(refs[std::size_t(v)]);  // rotated away
    s.content.drop_caches();
    const bytes file = m.step();
    auto buf = fresh_buffer(d);
    buf->begin_stream();
    auto st = s.content.start_stream("run/ckpt_n.pt", buf);
    int rewrites = 0;  // Catch's assertions are for the test's own thread
    std::thread rotation([&, round] {
      // The version below the base rewritten (the versions below it go), then the base itself.
      for (const std::size_t v : {std::size_t(kChain - 2), std::size_t(kChain - 1)}) {
        std::this_thread::sleep_for(std::chrono::microseconds(1500 * round + 500));
        rewrites += s.content.rekey(refs[v].version) > 0;
        sync_like_fs(s);  // the old chain's objects go now, unless a decode still reads them
      }
    });
    for (std::size_t at = 0; at < file.size(); at += 65536) {
      buf->write(at, std::span(file).subspan(at, std::min<std::size_t>(65536, file.size() - at)));
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    rotation.join();
    CHECK(rewrites == 2);
    const auto r = s.content.put("run/ckpt_n.pt", buf, std::move(st));
    const auto want = plain_put(plain.content, p, "run/ckpt_n.pt", file);
    sync_like_fs(s);
    CHECK(object_files(d) == 2);  // the base (rewritten) and the new version: the chain went
    CHECK(s.content.info(r).kind == "delta");
    CHECK(s.content.info(r).base == refs.back().version);
    dropped += int(s.content.usage().streams_dropped);
    s.content.drop_caches();
    differ += read_all(s.content, r) != read_all(plain.content, want);
  }
  CHECK(dropped == 0);
  CHECK(differ == 0);
}
