// admin::store_session: a store opened like the daemon does (lock, objects, journal, content,
// filesystem, replay) and closed with everything synced; a second opener is refused with a
// message naming the holder and what to do; tools never create a store by accident; objects no
// version records are removed at the daemon's open when the journal is whole, else kept.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/filesystem.hpp>
#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "codec/error.hpp"
#include "fs/admin/store_session.hpp"
#include "fs/store/object_store.hpp"

namespace bf = boost::filesystem;
using namespace ckpt::fs;
using namespace ckpt::fs::admin;

namespace {

struct temp_dir {
  temp_dir() : dir(bf::temp_directory_path() / bf::unique_path("ckpt-session-%%%%%%%%")) {
    bf::create_directories(dir);
  }
  ~temp_dir() { bf::remove_all(dir); }
  bf::path dir;
};

store_session_options tool_options() {
  store_session_options o;
  o.create = false;
  return o;
}

}  // namespace

TEST_CASE("store session: open, write, close, reopen offline", "[admin]") {
  temp_dir tmp;
  const bf::path store = tmp.dir / "store";
  CHECK_FALSE(is_store_dir(store));
  // A tool never creates a store: a typo must not leave an empty one behind.
  try {
    store_session s(store, tool_options());
    FAIL("opened a store that does not exist");
  } catch (const ckpt::io_error& e) {
    CHECK(e.sys_errno() == ENOENT);
    CHECK(std::string(e.what()).find("not a ckptfs store") != std::string::npos);
  }
  CHECK_FALSE(bf::exists(store / "journal"));

  const std::string data = "hello, store";
  {
    store_session s(store, store_session_options{});  // the daemon's way: created
    auto& fs = s.fs();
    auto [st, o] = fs.create(1, "f.txt", 0644, O_WRONLY | O_CREAT, 0, 0);
    auto b = std::as_bytes(std::span(data.data(), data.size()));
    fs.write(o.fh, 0, std::vector<std::byte>(b.begin(), b.end()));
    fs.flush(o.fh);
    fs.release(o.fh);  // committed on a worker; ~store_session finishes it and syncs
  }
  CHECK(is_store_dir(store));
  store_session s(store, tool_options());
  CHECK(s.replayed_records() > 0);
  CHECK(s.unknown_records() == 0);
  const auto st = s.fs().lookup(1, "f.txt");
  CHECK(std::uint64_t(st.st_size) == data.size());
  CHECK(s.fs().content_of(st.st_ino).size == data.size());
  CHECK(bf::equivalent(s.store_dir(), store));
}

TEST_CASE("store session: a held store is refused with the holder's pid", "[admin]") {
  temp_dir tmp;
  const bf::path store = tmp.dir / "store";
  store_session first(store, store_session_options{});
  try {
    store_session second(store, tool_options());
    FAIL("two sessions on one store");
  } catch (const ckpt::io_error& e) {
    const std::string msg = e.what();
    CHECK(e.sys_errno() == EWOULDBLOCK);
    CHECK(msg.find("pid " + std::to_string(::getpid())) != std::string::npos);
    CHECK(msg.find("in use") != std::string::npos);
    CHECK(msg.find("inside its mount") != std::string::npos);
  }
}

TEST_CASE("store session: objects no version records are the daemon's to remove at open",
          "[admin]") {
  // A crash between an object's write and its record (a checkpoint closed without fsync, the
  // daemon killed before the journal's next sync) leaves an object nothing names.
  temp_dir tmp;
  const bf::path store = tmp.dir / "store";
  const std::string data = "recorded";
  {
    store_session s(store, store_session_options{});
    auto& fs = s.fs();
    auto [st, o] = fs.create(1, "f.txt", 0644, O_WRONLY | O_CREAT, 0, 0);
    auto b = std::as_bytes(std::span(data.data(), data.size()));
    fs.write(o.fh, 0, std::vector<std::byte>(b.begin(), b.end()));
    fs.flush(o.fh);
    fs.release(o.fh);
  }
  const std::string junk(100000, 'x');
  const auto plant = [&] {
    ckpt::store::object_store objects(store / "objects");
    const auto piece = std::as_bytes(std::span(junk.data(), junk.size()));
    const std::span<const std::byte> pieces[] = {piece};
    return objects.put(pieces).id;
  };
  const auto exists = [&](std::uint64_t id) {
    ckpt::store::object_store objects(store / "objects");
    const auto ids = objects.list();
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  const auto reads_back = [&](store_session& s) {
    const auto st = s.fs().lookup(1, "f.txt");
    CHECK(s.fs().content_of(st.st_ino).size == data.size());
  };
  const auto orphan = plant();
  {
    store_session s(store, tool_options());  // a tool: left to `ckptctl gc`
    CHECK(s.unrecorded_objects().objects == 0);
    reads_back(s);
  }
  CHECK(exists(orphan));

  SECTION("a whole journal: removed") {
    store_session_options o;
    o.sweep_unrecorded = true;
    store_session s(store, o);
    CHECK(s.unrecorded_objects().objects == 1);
    CHECK(s.unrecorded_objects().bytes >= junk.size());
    CHECK(s.unrecorded_objects().removed);
    CHECK_FALSE(exists(orphan));
    reads_back(s);
  }
  SECTION("a journal whose tail was dropped: kept (a dropped record may name it)") {
    {
      std::ofstream j((store / "journal").string(), std::ios::binary | std::ios::app);
      j << std::string(20, '\xab');
    }
    store_session_options o;
    o.sweep_unrecorded = true;
    store_session s(store, o);
    CHECK(s.journal().tail().bytes == 20);
    CHECK(s.unrecorded_objects().objects == 1);
    CHECK_FALSE(s.unrecorded_objects().removed);
    CHECK(exists(orphan));
    reads_back(s);
    // The dropped bytes are kept aside, whole.
    REQUIRE_FALSE(s.journal().tail().kept.empty());
    std::ifstream kept(s.journal().tail().kept, std::ios::binary);
    const std::string got((std::istreambuf_iterator<char>(kept)), std::istreambuf_iterator<char>());
    CHECK(got == std::string(20, '\xab'));
  }
}
