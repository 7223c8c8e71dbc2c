// ckptctl's store-independent helpers (tools/ctl_util): durations, store paths, sizes, tables,
// mountinfo parsing and the progress bar's text.
#include <catch2/catch.hpp>
#include <string>

#include "tools/ctl_util.hpp"

using namespace ckpt::tools;

TEST_CASE("ckptctl: durations", "[admin]") {
  CHECK(parse_duration("30s") == 30);
  CHECK(parse_duration("15m") == 900);
  CHECK(parse_duration("2h") == 7200);
  CHECK(parse_duration("7d") == 7 * 86400);
  CHECK(parse_duration("1w") == 7 * 86400);
  CHECK(parse_duration("1h30m") == 5400);
  CHECK(parse_duration("1.5h") == 5400);
  CHECK(parse_duration("0") == 0);
  CHECK(parse_duration("0s") == 0);
  for (const char* bad : {"", "10", "s", "3x", "-5m", "1h-", "1..5h", "h1", "1 h", ".h", "1e3s"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_duration(bad), usage_error);
  }
}

TEST_CASE("ckptctl: store paths are normalised", "[admin]") {
  CHECK(normalize_store_path("") == "");
  CHECK(normalize_store_path("/") == "");
  CHECK(normalize_store_path(".") == "");
  CHECK(normalize_store_path("run1/step_5.pt") == "run1/step_5.pt");
  CHECK(normalize_store_path("/run1//step_5.pt/") == "run1/step_5.pt");
  CHECK(normalize_store_path("./run1/../run2/./x") == "run2/x");
  CHECK(normalize_store_path("a/..") == "");
  CHECK_THROWS_AS(normalize_store_path(".."), usage_error);
  CHECK_THROWS_AS(normalize_store_path("a/../../b"), usage_error);
}

TEST_CASE("ckptctl: sizes, ratios, times", "[admin]") {
  CHECK(human_bytes(0) == "0 B");
  CHECK(human_bytes(1023) == "1023 B");
  CHECK(human_bytes(1536) == "1.5 KiB");
  CHECK(human_bytes(5.0 * (1 << 20)) == "5.0 MiB");
  CHECK(human_bytes(3.25 * (1ull << 30)) == "3.2 GiB");
  CHECK(plural(1, "version") == "1 version");
  CHECK(plural(0, "object") == "0 objects");
  CHECK(ratio_text(100, 0) == "-");
  CHECK(ratio_text(100, 8) == "12.5x");
  CHECK(ratio_text(1000, 2) == "500x");
  CHECK(time_text(0) == "-");
  CHECK(time_text(1700000000.5).size() == 19);  // "YYYY-MM-DD HH:MM:SS" in local time
}

TEST_CASE("ckptctl: text tables pad columns", "[admin]") {
  text_table t({"A", "NUM", "NAME"}, {false, true, false});
  t.add({"x", "5", "first"});
  t.add({"long", "12345", "second"});
  CHECK(t.render("") ==
        "A       NUM  NAME\n"
        "x         5  first\n"
        "long  12345  second\n");
}

TEST_CASE("ckptctl: mountinfo lines", "[admin]") {
  auto e = parse_mountinfo_line(
      "36 35 0:51 / /mnt/my\\040ckpt rw,nosuid,nodev,relatime shared:1 - fuse.ckptfs "
      "/data/my\\040store rw,user_id=0,group_id=0,default_permissions");
  REQUIRE(e);
  CHECK(e->mount_point == "/mnt/my ckpt");
  CHECK(e->root == "/");
  CHECK(e->fstype == "fuse.ckptfs");
  CHECK(e->source == "/data/my store");
  auto b = parse_mountinfo_line("40 35 0:51 /run1 /mnt/bind rw - fuse.ckptfs /data/s rw");
  REQUIRE(b);
  CHECK(b->root == "/run1");
  CHECK_FALSE(parse_mountinfo_line("garbage"));
  CHECK_FALSE(parse_mountinfo_line("1 2 3:4 / /x rw shared:1"));
}

TEST_CASE("ckptctl: progress bar text", "[admin]") {
  CHECK(progress_bar::render("gc", 5, 10, 10) == "gc       [#####.....]  50%  5 / 10");
  CHECK(progress_bar::render("verify", 0, 0, 4) == "verify   [####] 100%  0 / 0");
  CHECK(progress_bar::render("export", 1 << 20, 4 << 20, 4) ==
        "export   [#...]  25%  1.0 MiB / 4.0 MiB");
  progress_bar off(false);  // piped: never draws
  off.update("x", 1, 2);
  off.clear();
  CHECK_FALSE(off.enabled());
}
