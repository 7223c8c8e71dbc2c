// Store lock (fs/store/store_lock.hpp): one holder per store, the error names the holder's pid,
// released on destruction and when the holding process is killed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "codec/error.hpp"
#include "fs/store/store_lock.hpp"
#include "store_test_util.hpp"

using namespace ckpt;
using namespace ckpt::store;

namespace {

// The io_error of a second lock on `dir` (fails the test if locking succeeds).
io_error conflict(const boost::filesystem::path& dir) {
  try {
    store_lock second(dir);
  } catch (const io_error& e) {
    return e;
  }
  FAIL("a second store_lock on the same store succeeded");
  return io_error(0, "");
}

}  // namespace

TEST_CASE("lock: a second lock fails with EWOULDBLOCK and the holder's pid", "[store]") {
  test::temp_dir tmp;
  const auto dir = tmp.path() / "store";  // created by the lock
  {
    store_lock first(dir);
    auto e = conflict(dir);
    CHECK(e.sys_errno() == EWOULDBLOCK);
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("pid " + std::to_string(::getpid())));
    CHECK_THAT(msg, Catch::Contains(dir.string()));
    store_lock moved(std::move(first));  // the lock moves with the object
    CHECK(conflict(dir).sys_errno() == EWOULDBLOCK);
  }
  store_lock again(dir);  // released on destruction
}

TEST_CASE("lock: held by a child process until it is killed", "[store]") {
  test::temp_dir tmp;
  const auto dir = tmp.path();
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    try {
      static store_lock held(dir);
      char ok = 'k';
      if (::write(fds[1], &ok, 1) != 1) ::_exit(1);
      for (;;) ::pause();
    } catch (...) {
      ::_exit(2);
    }
  }
  ::close(fds[1]);
  char c = 0;
  const bool started = ::read(fds[0], &c, 1) == 1;
  ::close(fds[0]);
  if (started) {
    auto e = conflict(dir);
    CHECK(e.sys_errno() == EWOULDBLOCK);
    CHECK_THAT(std::string(e.what()), Catch::Contains("pid " + std::to_string(pid)));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(started);
  CHECK(WIFSIGNALED(status));
  store_lock mine(dir);  // the kernel dropped the dead holder's lock
}
