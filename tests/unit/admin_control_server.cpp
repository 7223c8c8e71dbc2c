// The control socket server (fs/admin/control_server) with a fake handler, over real UNIX
// sockets: results, progress, error mapping, malformed requests, a client that disconnects in
// the middle of an operation (the operation completes, the process survives: no SIGPIPE), many
// clients at once, a stale socket, a path longer than sun_path, and stopping with a request in
// flight.
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <boost/filesystem.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "codec/error.hpp"
#include "fs/admin/control_protocol.hpp"
#include "fs/admin/control_server.hpp"

namespace bf = boost::filesystem;
using namespace ckpt::fs::admin;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

struct temp_dir {
  temp_dir() : dir(bf::temp_directory_path() / bf::unique_path("ckpt-admin-%%%%%%%%")) {
    bf::create_directories(dir);
  }
  ~temp_dir() { bf::remove_all(dir); }
  bf::path dir;
};

// A fake service: "echo" returns the request with progress, "fail" throws what it is told,
// "slow" waits until released (counting completions), "spam" reports progress 100000 times.
struct fake_service {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> started{0}, finished{0};

  json handle(const json& req, const progress_fn& progress) {
    const std::string op = req.at("op");
    if (op == "echo") {
      for (std::uint64_t i = 0; i <= 4; ++i) progress("echo", i, 4);
      return req;
    }
    if (op == "fail") {
      const std::string kind = req.at("kind");
      if (kind == "io") throw ckpt::io_error(ENOENT, "run1/x.pt: no such file");
      if (kind == "invalid") throw ckpt::invalid_argument("keep_last must be >= 0");
      if (kind == "type") return json{{"n", req.at("n").get<int>()}};
      throw std::runtime_error("something broke");
    }
    if (op == "slow") {
      ++started;
      for (std::uint64_t i = 0;; ++i) {
        progress("slow", i, 1000000);
        std::unique_lock lk(mu);
        if (cv.wait_for(lk, 1ms, [&] { return release; })) break;
      }
      ++finished;
      return {{"slow", true}};
    }
    if (op == "spam") {
      for (std::uint64_t i = 0; i < 100000; ++i) progress("spam", i, 100000);
      progress("spam", 100000, 100000);
      return {{"spam", true}};
    }
    throw ckpt::invalid_argument("unknown op " + op);
  }
  void let_go() {
    {
      std::lock_guard lk(mu);
      release = true;
    }
    cv.notify_all();
  }
};

control_server::handler_fn handler_of(fake_service& s) {
  return [&s](const json& r, const progress_fn& p) { return s.handle(r, p); };
}

// Sends raw bytes and returns everything the server sent until it closed.
std::string raw_exchange(const std::string& path, const std::string& bytes) {
  unique_fd fd = connect_unix(path);
  REQUIRE(send_all(fd.get(), bytes) == 0);
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, std::size_t(n));
  }
  return out;
}

int remote_errno(const std::string& path, const json& req) {
  try {
    control_call(path, req);
  } catch (const remote_error& e) {
    return e.sys_errno();
  }
  return 0;
}

}  // namespace

TEST_CASE("control server: results, progress and errors", "[admin]") {
  temp_dir tmp;
  fake_service svc;
  const std::string path = control_socket_path(tmp.dir.string());
  control_server server(path, handler_of(svc));

  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK((st.st_mode & 0777) == 0600);

  std::vector<std::uint64_t> seen;
  const json r = control_call(path, {{"op", "echo"}, {"x", "a\nb"}},
                              [&](std::string_view phase, std::uint64_t done, std::uint64_t total) {
                                CHECK(phase == "echo");
                                CHECK(total == 4);
                                seen.push_back(done);
                              });
  CHECK(r.at("x") == "a\nb");
  REQUIRE_FALSE(seen.empty());
  CHECK(seen.front() == 0);
  CHECK(seen.back() == 4);  // the completing report is never throttled away

  CHECK(remote_errno(path, {{"op", "fail"}, {"kind", "io"}}) == ENOENT);
  CHECK(remote_errno(path, {{"op", "fail"}, {"kind", "invalid"}}) == EINVAL);
  CHECK(remote_errno(path, {{"op", "fail"}, {"kind", "type"}, {"n", "seven"}}) == EINVAL);
  CHECK(remote_errno(path, {{"op", "fail"}, {"kind", "other"}}) == EIO);
  try {
    control_call(path, {{"op", "fail"}, {"kind", "io"}});
    FAIL("no error");
  } catch (const remote_error& e) {
    CHECK(std::string(e.what()) == "run1/x.pt: no such file");
  }

  // Malformed requests get an error line, and the server keeps serving.
  for (const char* bad : {"not json\n", "[1,2]\n", "{\"path\":\"x\"}\n"}) {
    const auto line = parse_response_line(raw_exchange(path, bad));
    CHECK(line.type == response::kind::error);
    CHECK(line.err == EINVAL);
  }
  // A request longer than the limit: refused, not buffered without end.
  const auto big = raw_exchange(path, std::string(max_request_bytes + 10, 'x'));
  CHECK(parse_response_line(big.substr(0, big.find('\n'))).err == EMSGSIZE);
  // A client that connects and says nothing, then leaves.
  { unique_fd idle = connect_unix(path); }
  CHECK(control_call(path, {{"op", "echo"}}).at("op") == "echo");

  // Progress at most ~10 per second: 100000 reports in well under a second make few lines.
  const auto lines = raw_exchange(path, "{\"op\":\"spam\"}\n");
  std::size_t n = 0;
  for (char c : lines) n += c == '\n';
  CHECK(n <= 15);
  CHECK(lines.find("\"ok\":true") != std::string::npos);
}

TEST_CASE("control server: a client that leaves mid-operation costs nothing", "[admin]") {
  temp_dir tmp;
  fake_service svc;
  const std::string path = control_socket_path(tmp.dir.string());
  control_server server(path, handler_of(svc));
  {
    unique_fd fd = connect_unix(path);
    REQUIRE(send_all(fd.get(), "{\"op\":\"slow\"}\n") == 0);
    while (svc.started.load() == 0) std::this_thread::sleep_for(1ms);
    char buf[256];
    REQUIRE(::recv(fd.get(), buf, sizeof buf, 0) > 0);  // progress is flowing
  }  // disconnect while it runs: further progress writes hit a closed socket (EPIPE, no SIGPIPE)
  std::this_thread::sleep_for(50ms);
  svc.let_go();
  while (svc.finished.load() == 0) std::this_thread::sleep_for(1ms);
  CHECK(control_call(path, {{"op", "echo"}}).at("op") == "echo");  // still serving
}

TEST_CASE("control server: many clients at once", "[admin]") {
  temp_dir tmp;
  fake_service svc;
  const std::string path = control_socket_path(tmp.dir.string());
  control_server server(path, handler_of(svc));
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i)
    clients.emplace_back([&, i] {
      for (int k = 0; k < 20; ++k)
        if (control_call(path, {{"op", "echo"}, {"i", i}, {"k", k}}).at("k") == k) ++ok;
    });
  for (auto& t : clients) t.join();
  CHECK(ok.load() == 160);
}

TEST_CASE("control server: stale socket, long path, stop with a request in flight", "[admin]") {
  temp_dir tmp;
  fake_service svc;
  // A stale socket of a dead daemon is replaced; a regular file is not.
  const std::string path = control_socket_path(tmp.dir.string());
  { unique_fd stale = listen_unix(path); }  // closed without unlinking: stale
  CHECK_THROWS_AS(connect_unix(path), ckpt::io_error);
  {
    control_server server(path, handler_of(svc));
    CHECK(control_call(path, {{"op", "echo"}}).at("op") == "echo");
  }
  CHECK_FALSE(bf::exists(path));  // unlinked at stop
  const std::string file = (tmp.dir / "not-a-socket").string();
  { std::ofstream(file) << "x"; }
  CHECK_THROWS_AS(control_server(file, handler_of(svc)), ckpt::io_error);
  CHECK(bf::exists(file));

  // A store path longer than sun_path (108 bytes).
  bf::path deep = tmp.dir;
  while (deep.string().size() < 150) deep /= "a-rather-long-directory-name";
  bf::create_directories(deep);
  const std::string long_path = control_socket_path(deep.string());
  {
    control_server server(long_path, handler_of(svc));
    CHECK(control_call(long_path, {{"op", "echo"}}).at("op") == "echo");
  }
  CHECK_FALSE(bf::exists(long_path));

  // stop_accepting() with a request running: no new connections, the running one finishes and
  // gets its answer; the destructor waits for it.
  json answer;
  std::thread client;
  {
    control_server server(path, handler_of(svc));
    client = std::thread([&] { answer = control_call(path, {{"op", "slow"}}); });
    while (svc.started.load() == 0) std::this_thread::sleep_for(1ms);
    server.stop_accepting();
    CHECK_FALSE(bf::exists(path));
    CHECK_THROWS_AS(connect_unix(path), ckpt::io_error);
    std::thread releaser([&] {
      std::this_thread::sleep_for(100ms);
      svc.let_go();
    });
    releaser.join();
  }  // ~control_server joins the connection after it answered
  client.join();
  CHECK(answer.at("slow") == true);
}
