// The control channel's framing (fs/admin/control_protocol): message lines, parsing of every
// response kind and of malformed ones, request validation, the line splitter, the progress
// throttle and the exception -> (message, errno) mapping.
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <new>
#include <stdexcept>
#include <string>

#include "codec/error.hpp"
#include "fs/admin/control_protocol.hpp"

using namespace ckpt::fs::admin;
using nlohmann::json;

namespace {

int errno_of_parse(const std::string& line) {
  try {
    parse_response_line(line);
  } catch (const ckpt::io_error& e) {
    return e.sys_errno();
  }
  return 0;
}

error_reply reply_for(auto&& thrower) {
  try {
    thrower();
  } catch (...) {
    return error_reply_of(std::current_exception());
  }
  FAIL("did not throw");
  return {};
}

}  // namespace

TEST_CASE("admin protocol: lines are one JSON object each, newline-terminated", "[admin]") {
  const std::string p = progress_line("verify", 3, 10);
  CHECK(p.back() == '\n');
  CHECK(p.find('\n') == p.size() - 1);
  CHECK(json::parse(p) == json::parse(R"({"progress":{"phase":"verify","done":3,"total":10}})"));

  // A result whose strings contain newlines still makes one line (JSON escapes them).
  const std::string r = result_line({{"paths", {"a\nb", "c"}}});
  CHECK(r.find('\n') == r.size() - 1);
  CHECK(json::parse(r) == json::parse(R"({"ok":true,"result":{"paths":["a\nb","c"]}})"));

  const std::string e = error_line("no such file: x", ENOENT);
  CHECK(e.find('\n') == e.size() - 1);
  CHECK(json::parse(e) == json({{"ok", false}, {"error", "no such file: x"}, {"errno", ENOENT}}));

  // Invalid UTF-8 in a name must not turn a finished operation into an exception.
  CHECK_NOTHROW(result_line({{"path", std::string("bad\xff\xfe")}}));
  CHECK(control_socket_path("/data/store") == "/data/store/control.sock");
  CHECK(control_socket_path("/data/store/") == "/data/store/control.sock");
}

TEST_CASE("admin protocol: responses parse into their kinds", "[admin]") {
  auto p = parse_response_line(progress_line("prune", 5, 7));
  CHECK(p.type == response::kind::progress);
  CHECK(p.phase == "prune");
  CHECK(p.done == 5);
  CHECK(p.total == 7);

  auto r = parse_response_line(result_line({{"freed_bytes", 42}}));
  CHECK(r.type == response::kind::result);
  CHECK(r.result.at("freed_bytes") == 42);

  auto e = parse_response_line(error_line("gone", ENOENT));
  CHECK(e.type == response::kind::error);
  CHECK(e.message == "gone");
  CHECK(e.err == ENOENT);

  // An error without a usable errno is EIO, never 0 (a caller must not mistake it for success).
  CHECK(parse_response_line(R"({"ok":false,"error":"x"})").err == EIO);
  CHECK(parse_response_line(R"({"ok":false,"error":"x","errno":0})").err == EIO);
}

TEST_CASE("admin protocol: malformed responses are EPROTO", "[admin]") {
  for (const char* bad :
       {"", "{", "[]", "42", R"({"x":1})", R"({"ok":"yes"})", R"({"ok":true})",
        R"({"ok":true,"result":[1]})", R"({"ok":false})",
        R"({"progress":{"phase":"p","done":-1,"total":2}})",
        R"({"progress":{"phase":1,"done":1,"total":2}})", R"({"progress":[1,2]})"}) {
    INFO(bad);
    CHECK(errno_of_parse(bad) == EPROTO);
  }
}

TEST_CASE("admin protocol: requests must be objects with an op", "[admin]") {
  CHECK(parse_request_line(R"({"op":"ls","path":"run1"})").at("path") == "run1");
  for (const char* bad : {"", "nonsense", "[]", R"({"path":"x"})", R"({"op":3})"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_request_line(bad), ckpt::invalid_argument);
  }
}

TEST_CASE("admin protocol: exceptions map to messages and errnos", "[admin]") {
  CHECK(reply_for([] { throw ckpt::io_error(ENOENT, "x: missing"); }).err == ENOENT);
  CHECK(reply_for([] { throw ckpt::io_error(ENOENT, "x: missing"); }).message == "x: missing");
  CHECK(reply_for([] { throw ckpt::io_error(0, "odd"); }).err == EIO);
  CHECK(reply_for([] { throw ckpt::invalid_argument("bad keep_last"); }).err == EINVAL);
  CHECK(reply_for([] { throw ckpt::corrupt_error("checksum"); }).err == EIO);
  CHECK(reply_for([] { throw std::bad_alloc(); }).err == ENOMEM);
  CHECK(reply_for([] { throw std::runtime_error("boom"); }).err == EIO);
  CHECK(reply_for([] { throw 42; }).err == EIO);
  // A request field of the wrong type (the service's json.at().get<>() throws) is EINVAL.
  CHECK(reply_for([] {
          json j = {{"keep_last", "three"}};
          (void)j.at("keep_last").get<int>();
        }).err == EINVAL);
  CHECK(reply_for([] {
          json j = json::object();
          (void)j.at("paths");
        }).err == EINVAL);
}

TEST_CASE("admin protocol: the line splitter", "[admin]") {
  line_splitter s(16);
  CHECK_FALSE(s.next());
  s.append("ab");
  CHECK_FALSE(s.next());
  s.append("c\nde\n\nf");
  CHECK(s.next() == std::optional<std::string>("abc"));
  CHECK(s.next() == std::optional<std::string>("de"));
  CHECK(s.next() == std::optional<std::string>(""));
  CHECK_FALSE(s.next());
  CHECK(s.pending() == 1);
  s.append("g\n");
  CHECK(s.next() == std::optional<std::string>("fg"));

  // A line over the limit is refused, whether or not its newline has arrived.
  line_splitter t(4);
  t.append("12345");
  CHECK_THROWS_AS(t.next(), ckpt::io_error);
  line_splitter u(4);
  u.append("123456\n");
  CHECK_THROWS_AS(u.next(), ckpt::io_error);

  // Many lines through one splitter (exercises compaction).
  line_splitter v(64);
  std::string all;
  for (int i = 0; i < 20000; ++i) all += std::to_string(i) + "\n";
  for (std::size_t off = 0; off < all.size(); off += 777) v.append(all.substr(off, 777));
  for (int i = 0; i < 20000; ++i)
    REQUIRE(v.next() == std::optional<std::string>(std::to_string(i)));
  CHECK_FALSE(v.next());
}

TEST_CASE("admin protocol: progress is throttled but phases start and end", "[admin]") {
  using namespace std::chrono_literals;
  progress_throttle t(100ms);
  const auto t0 = progress_throttle::clock::time_point{} + 1h;
  CHECK(t.admit("verify", 0, 100, t0));  // first of a phase
  CHECK_FALSE(t.admit("verify", 1, 100, t0 + 10ms));
  CHECK_FALSE(t.admit("verify", 2, 100, t0 + 99ms));
  CHECK(t.admit("verify", 3, 100, t0 + 100ms));  // the interval passed
  CHECK_FALSE(t.admit("verify", 4, 100, t0 + 150ms));
  CHECK(t.admit("verify", 100, 100, t0 + 160ms));        // completion always goes out
  CHECK_FALSE(t.admit("verify", 100, 100, t0 + 170ms));  // but only once
  CHECK(t.admit("gc", 0, 5, t0 + 171ms));                // a new phase at once
  CHECK(t.admit("gc", 5, 5, t0 + 172ms));

  // At most ~10 per second over a long run of reports.
  progress_throttle u(100ms);
  int sent = 0;
  for (int ms = 0; ms < 1000; ++ms)
    sent += u.admit("deep", std::uint64_t(ms), 100000, t0 + std::chrono::milliseconds(ms));
  CHECK(sent >= 9);
  CHECK(sent <= 11);
}
