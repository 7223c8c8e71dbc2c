// Reclaiming while others read or sync: objects a record made unnecessary are removed only after
// that record is durable, never while a decode that started earlier may read them, and never by gc
// while a sync that took them is in progress. Each test copies the store aside at the moment a
// crash would hit (journal::append only buffers until sync) and replays the copy.
#include <algorithm>
#include <atomic>
#include <boost/filesystem.hpp>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "codec/error.hpp"
#include "codec/format/source.hpp"
#include "content_test_util.hpp"
#include "fs/content/content_store.hpp"
#include "fs/store/journal.hpp"
#include "fs/store/object_store.hpp"

namespace bfs = boost::filesystem;
using namespace ckpt;
using bytes = std::vector<std::byte>;
using namespace ckpt::test;

namespace {
// What a crash leaves: the journal's synced bytes and the object files, copied aside.
void crash_copy(const bfs::path& from, const bfs::path& to) {
  bfs::create_directories(to / "objects");
  bfs::copy_file(from / "journal", to / "journal");
  for (auto& e : bfs::directory_iterator(from / "objects"))
    bfs::copy_file(e.path(), to / "objects" / e.path().filename());
}
}  // namespace

TEST_CASE("a reader pin released between a rekey and its sync keeps the old base until the sync",
          "[content]") {
  temp_dir a, b;
  trainer t;
  fs::content_ref r1, r2;
  bytes want2;
  {
    opened s(a.path, {});
    r1 = s.content.put("run/step_1.safetensors", format::memory_source(t.step()));
    want2 = t.step();
    r2 = s.content.put("run/step_2.safetensors", format::memory_source(want2));
    REQUIRE(s.content.info(r2).kind == "delta");
    sync_like_fs(s);
    want2 = read_all(s.content, r2);
    auto pin = s.content.open(r1);             // someone reads step_1 (open handle)
    s.content.unref(r1);                       // prune removed step_1's name (its record synced)
    REQUIRE(s.content.rekey(r2.version) > 0);  // appended, not yet synced
    pin.reset();                 // the reader closes before filesystem::rekey's sync_journal
    crash_copy(a.path, b.path);  // kill -9 here
  }
  opened s(b.path, {}, {r2});
  CHECK_NOTHROW(read_all(s.content, r2));
}

TEST_CASE("gc between a sync's take_unneeded_objects and the journal sync keeps what it took",
          "[content]") {
  temp_dir a, b;
  trainer t;
  fs::content_ref r1, r2;
  {
    opened s(a.path, {});
    r1 = s.content.put("run/step_1.safetensors", format::memory_source(t.step()));
    r2 = s.content.put("run/step_2.safetensors", format::memory_source(t.step()));
    sync_like_fs(s);
    REQUIRE(s.content.rekey(r2.version) > 0);
    auto taken = s.content.take_unneeded_objects();  // thread A: sync_journal, before sync()
    s.content.collect_garbage(false);                // thread B: ckptctl gc
    crash_copy(a.path, b.path);                      // crash before A's journal sync
  }
  opened s(b.path, {}, {r1, r2});
  CHECK_NOTHROW(read_all(s.content, r2));
}

TEST_CASE("reads of a kept delta while its base chain is rekeyed and reclaimed all succeed",
          "[content]") {
  int failures = 0, rounds = 0;
  std::string last;
  for (int round = 0; round < 15; ++round) {
    temp_dir a;
    trainer t(1 << 20);
    opened s(a.path, {});
    std::vector<fs::content_ref> refs;
    for (int i = 0; i < 8; ++i)
      refs.push_back(s.content.put("run/step_" + std::to_string(i) + ".safetensors",
                                   format::memory_source(t.step())));
    sync_like_fs(s);
    const auto top = refs.back();
    const bytes want = read_all(s.content, top);
    for (int i = 0; i < 4; ++i) s.content.unref(refs[i]);  // prune: names of 1..4 gone
    std::atomic<bool> stop{false};
    std::thread reader([&] {
      while (!stop) {
        s.content.drop_caches();
        try {
          if (read_all(s.content, top) != want) {
            ++failures;
            last = "wrong bytes";
          }
        } catch (const std::exception& e) {
          ++failures;
          last = e.what();
        }
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + 7 * round));
    s.content.rekey(refs[4].version);
    sync_like_fs(s);  // filesystem::rekey: sync, then the old chain goes
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    stop = true;
    reader.join();
    ++rounds;
  }
  INFO("last failure: " << last);
  CHECK(failures == 0);
}

TEST_CASE("objects handed back after a failed sync are removed by the next one", "[content]") {
  temp_dir a;
  trainer t;
  opened s(a.path, {});
  const auto r1 = s.content.put("run/step_1.safetensors", format::memory_source(t.step()));
  const auto r2 = s.content.put("run/step_2.safetensors", format::memory_source(t.step()));
  sync_like_fs(s);
  REQUIRE(s.content.rekey(r2.version) > 0);  // r2's old object becomes unneeded
  auto taken = s.content.take_unneeded_objects();
  REQUIRE(!taken.empty());
  REQUIRE(!s.content.has_unneeded_objects());
  // filesystem::sync_journal when journal::sync() throws: the ids go back, not lost.
  s.content.return_unneeded_objects(taken);
  REQUIRE(s.content.has_unneeded_objects());
  s.content.collect_garbage(false);  // gc must not take them either: their record is not durable
  for (auto id : taken) REQUIRE(bfs::exists(object_file(a.path, id)));
  auto again = s.content.take_unneeded_objects();
  std::sort(taken.begin(), taken.end());
  std::sort(again.begin(), again.end());
  REQUIRE(again == taken);
  s.journal.sync();
  s.content.remove_objects(again);
  for (auto id : taken) CHECK(!bfs::exists(object_file(a.path, id)));
  CHECK_NOTHROW(read_all(s.content, r1));
  CHECK_NOTHROW(read_all(s.content, r2));
}
