// admin::store_session: a store opened like the daemon does (lock, objects, journal, content,
// filesystem, replay) and closed with everything synced; a second opener is refused with a
// message naming the holder and what to do; tools never create a store by accident.
#include <fcntl.h>
#include <unistd.h>

#include <boost/filesystem.hpp>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "codec/error.hpp"
#include "fs/admin/store_session.hpp"

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
