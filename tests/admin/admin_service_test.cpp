// The management operations (fs/admin/admin_service) on a real store in a temp dir, files written
// through fs::filesystem as the mount would: ls, stat, rm, prune (each rule; the oldest kept
// version becomes a keyframe and the space is really freed), verify (flipped bit, truncated and
// missing objects, named by path), gc, export, bad requests. Served bytes of every kept version
// are compared before and after. ls counts head images in disk bytes and ratios (live and, from
// the image files, offline); status reports what a daemon holds.
#define CATCH_CONFIG_MAIN
#include <fcntl.h>
#include <unistd.h>

#include <boost/filesystem.hpp>
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <thread>

#include "../content/content_test_util.hpp"
#include "codec/error.hpp"
#include "fs/admin/admin_service.hpp"
#include "fs/content/content_store.hpp"
#include "fs/namespace/filesystem.hpp"
#include "fs/store/journal.hpp"
#include "fs/store/object_store.hpp"

namespace bf = boost::filesystem;
using namespace ckpt;
using namespace ckpt::fs;
using nlohmann::json;
using test::temp_dir;
using test::trainer;

namespace {

// A store opened as the daemon (or ckptctl offline) does.
struct opened {
  store::object_store objects;
  store::journal journal;
  content_store content;
  std::unique_ptr<filesystem> fs;
  std::unique_ptr<admin::admin_service> admin;
  explicit opened(const bf::path& dir, content_options opt = {},
                  std::uint64_t buffer_bytes = fs_config{}.buffer_bytes)
      : objects(dir / "objects"), journal(dir / "journal"), content(objects, journal, opt) {
    bf::create_directories(dir / "staging");
    fs_config cfg;
    cfg.store_dir = dir.string();
    cfg.staging_dir = (dir / "staging").string();
    cfg.buffer_bytes = buffer_bytes;
    fs = std::make_unique<filesystem>(journal, content, cfg);
    journal.replay([&](std::span<const std::byte> r) {
      if (!content.apply(r)) fs->replay_record(r);
    });
    fs->replay_done();
    admin = std::make_unique<admin::admin_service>(*fs, content, objects);
  }
  ~opened() { fs->shutdown(); }
  json run(const json& req) { return admin->handle(req); }
};

ino_t mkdir_p(filesystem& fs, const std::string& name) {
  return fs.mknod(root_ino, name, S_IFDIR | 0755, 0, 0, 0).st_ino;
}

void write_file(filesystem& fs, ino_t dir, const std::string& name,
                std::span<const std::byte> data) {
  auto [st, o] = fs.create(dir, name, 0644, O_WRONLY | O_CREAT | O_TRUNC, 0, 0);
  fs.write(o.fh, 0, data);
  fs.release(o.fh);
  fs.getattr(st.st_ino);    // waits for the commit
  fs.forget(st.st_ino, 1);  // as the kernel would, later: create counted a lookup
}

std::string served(filesystem& fs, const std::string& path) {
  const ino_t ino = fs.resolve(path);
  auto h = fs.open(ino, O_RDONLY).fh;
  std::string out;
  std::vector<std::byte> buf(1 << 20);
  for (std::uint64_t off = 0;;) {
    const std::size_t n = fs.read(h, off, buf);
    if (!n) break;
    out.append(reinterpret_cast<const char*>(buf.data()), n);
    off += n;
  }
  fs.release(h);
  return out;
}

std::uint64_t dir_bytes(const bf::path& p) {
  std::uint64_t n = 0;
  for (auto& e : bf::directory_iterator(p))
    if (bf::is_regular_file(e)) n += bf::file_size(e);
  return n;
}

// Two lineages: run/step_K.st (K = 1..n) and other/step_K.st, plus an ordinary file.
void populate(opened& s, int n) {
  auto& fs = *s.fs;
  const ino_t run = mkdir_p(fs, "run"), other = mkdir_p(fs, "other");
  trainer a, b(150000);  // another model: its own lineage from a keyframe
  for (int k = 1; k <= n; ++k) {
    write_file(fs, run, "step_" + std::to_string(k) + ".st", a.step());
    write_file(fs, other, "step_" + std::to_string(k) + ".st", b.step());
  }
  const std::string note = "notes";
  write_file(fs, root_ino, "notes.txt", std::as_bytes(std::span(note.data(), note.size())));
}

std::map<std::string, std::string> all_served(filesystem& fs) {
  std::map<std::string, std::string> out;
  for (const auto& f : fs.regular_files()) out[f.path] = served(fs, f.path);
  return out;
}

}  // namespace

TEST_CASE("admin: ls groups versions by lineage with totals, stat shows tensors and coding") {
  temp_dir tmp;
  opened s(tmp.path);
  populate(s, 4);
  const json ls = s.run({{"op", "ls"}});
  REQUIRE(ls["lineages"].size() == 2);
  CHECK(ls["files"].size() == 1);
  CHECK(ls["files"][0]["paths"][0] == "notes.txt");
  for (const auto& l : ls["lineages"]) {
    REQUIRE(l["versions"].size() == 4);
    CHECK(l["live_versions"] == 4);
    CHECK(l["versions"][0]["kind"] == "keyframe");
    CHECK(l["versions"][1]["kind"] == "delta");
    CHECK(l["versions"][1]["base"] == l["versions"][0]["version"]);
    CHECK(l["versions"][0]["created"].get<double>() > 1.6e9);
    CHECK(l["stored_bytes"].get<std::uint64_t>() < l["logical_bytes"].get<std::uint64_t>());
  }
  CHECK(ls["totals"]["live_versions"] == 9);
  // A directory selects its lineages only.
  const json sub = s.run({{"op", "ls"}, {"path", "run"}});
  REQUIRE(sub["lineages"].size() == 1);
  CHECK(sub["files"].empty());
  CHECK(sub["lineages"][0]["versions"][0]["paths"][0] == "run/step_1.st");

  const json st = s.run({{"op", "stat"}, {"path", "run/step_2.st"}});
  CHECK(st["kind"] == "delta");
  CHECK(st["coding"]["bits"] == content_options{}.bits);
  CHECK(st["coding"]["coder"] == "grouped");
  CHECK(st["coding"]["scope"] == "tensor");
  CHECK(st["coding"]["grid"] == "auto");
  REQUIRE(st["tensors"].size() == 2);
  CHECK(st["tensors"][0]["mode"] == "grid");  // grid=auto, the default
  CHECK(st["tensors"][0]["elements"].get<std::uint64_t>() > 0);

  CHECK_THROWS_AS(s.run({{"op", "stat"}, {"path", "run/nope.st"}}), io_error);
  CHECK_THROWS_AS(s.run({{"op", "stat"}, {"path", "run"}}), io_error);
  CHECK_THROWS_AS(s.run({{"op", "ls"}, {"path", "missing"}}), io_error);
  CHECK_THROWS_AS(s.run({{"op", "fly"}}), invalid_argument);
  CHECK_THROWS_AS(s.run(json::array()), invalid_argument);
  CHECK_THROWS_AS(s.run({{"op", "prune"}, {"paths", {"run"}}}), invalid_argument);  // no rule
  CHECK_THROWS_AS(s.run({{"op", "prune"}, {"paths", {"notes.txt"}}, {"keep_last", 1}}),
                  invalid_argument);  // not a checkpoint
  CHECK_THROWS_AS(s.run({{"op", "rm"}, {"paths", json::array()}}), invalid_argument);
}

TEST_CASE("admin: prune --keep-last rekeys the oldest kept version and frees the prefix") {
  temp_dir tmp;
  std::map<std::string, std::string> before;
  std::uint64_t pruned_stored = 0;
  {
    opened s(tmp.path);
    populate(s, 8);
    before = all_served(*s.fs);
    const std::uint64_t du_before = dir_bytes(tmp.path / "objects");

    const json dry =
        s.run({{"op", "prune"}, {"paths", {"run"}}, {"keep_last", 3}, {"dry_run", true}});
    REQUIRE(dry["lineages"].size() == 1);
    CHECK(dry["lineages"][0]["removed"].size() == 5);
    CHECK(s.fs->regular_files().size() == 17);

    const json out = s.run({{"op", "prune"}, {"paths", {"run/step_8.st"}}, {"keep_last", 3}});
    REQUIRE(out["lineages"].size() == 1);
    const auto& l = out["lineages"][0];
    REQUIRE(l["kept"].size() == 3);
    CHECK(l["kept"][0]["path"] == "run/step_6.st");
    CHECK(l["removed"].size() == 5);
    for (const auto& r : l["removed"]) pruned_stored += r["stored_bytes"].get<std::uint64_t>();
    REQUIRE(out["rekeyed"].size() == 1);
    const std::uint64_t du_after = dir_bytes(tmp.path / "objects");
    CHECK(du_after < du_before);
    CHECK(out["freed_bytes"].get<std::uint64_t>() > 0);
    CHECK(du_before - du_after == out["freed_bytes"].get<std::uint64_t>());

    const json st = s.run({{"op", "stat"}, {"path", "run/step_6.st"}});
    CHECK(st["kind"] == "keyframe");
    CHECK(st["base"] == 0);
    // The other lineage is untouched; kept versions read exactly as before.
    CHECK(s.fs->regular_files().size() == 12);
    for (const auto& [path, data] : all_served(*s.fs)) CHECK(before.at(path) == data);
    const json ls = s.run({{"op", "ls"}, {"path", "run"}});
    CHECK(ls["lineages"][0]["versions"].size() == 3);  // nothing hidden is left
    s.content.drop_caches();
    for (const auto& [path, data] : all_served(*s.fs)) CHECK(before.at(path) == data);
    CHECK(s.run({{"op", "verify"}, {"deep", true}})["ok"] == true);
  }
  // After a restart (journal replay of the rewritten version): same bytes, still clean.
  opened s(tmp.path);
  CHECK(s.fs->regular_files().size() == 12);
  for (const auto& [path, data] : all_served(*s.fs)) CHECK(before.at(path) == data);
  const json v = s.run({{"op", "verify"}, {"deep", true}});
  CHECK(v["ok"] == true);
  CHECK(v["unreferenced_objects"] == 0);
}

TEST_CASE("admin: prune --keep-every and --keep-newer-than, middle versions stay as hidden bases") {
  temp_dir tmp;
  opened s(tmp.path);
  populate(s, 7);
  const auto before = all_served(*s.fs);
  const json out = s.run({{"op", "prune"}, {"paths", {""}}, {"keep_every", 3}});
  REQUIRE(out["lineages"].size() == 2);
  for (const auto& l : out["lineages"]) {
    REQUIRE(l["kept"].size() == 3);  // steps 1, 4, 7
    CHECK(l["kept"][1]["path"].get<std::string>().ends_with("step_4.st"));
  }
  CHECK(out["rekeyed"].empty());  // the oldest kept is the keyframe
  for (const auto& [path, data] : all_served(*s.fs)) CHECK(before.at(path) == data);
  const json ls = s.run({{"op", "ls"}, {"path", "run"}});
  CHECK(ls["lineages"][0]["live_versions"] == 3);
  CHECK(ls["lineages"][0]["versions"].size() == 7);  // the deltas between are still needed

  // Everything was written just now: keep_newer_than keeps all.
  const json none = s.run({{"op", "prune"}, {"paths", {"run"}}, {"keep_newer_than", 3600}});
  CHECK(none["lineages"][0]["removed"].empty());
  // keep_newer_than 0 keeps nothing by age; with keep_last 1 only the newest survives.
  const json one =
      s.run({{"op", "prune"}, {"paths", {"run"}}, {"keep_newer_than", 0}, {"keep_last", 1}});
  CHECK(one["lineages"][0]["kept"].size() == 1);
  CHECK(s.run({{"op", "verify"}, {"deep", true}})["ok"] == true);
  for (const auto& [path, data] : all_served(*s.fs)) CHECK(before.at(path) == data);
}

TEST_CASE("admin: rm, export and gc") {
  temp_dir tmp;
  opened s(tmp.path);
  populate(s, 3);
  const auto before = all_served(*s.fs);
  const json rm = s.run({{"op", "rm"}, {"paths", {"other/step_3.st", "nope", "run"}}});
  CHECK(rm["removed"].size() == 1);
  REQUIRE(rm["errors"].size() == 2);
  CHECK(rm["errors"][0]["errno"] == ENOENT);
  CHECK(rm["errors"][1]["errno"] == EISDIR);
  CHECK_THROWS_AS(s.fs->resolve("other/step_3.st"), io_error);

  const auto dest = tmp.path / "exported.st";
  const json ex = s.run({{"op", "export"}, {"path", "run/step_2.st"}, {"dest", dest.string()}});
  CHECK(ex["bytes"].get<std::uint64_t>() == before.at("run/step_2.st").size());
  std::ifstream f(dest.string(), std::ios::binary);
  const std::string got((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CHECK(got.size() == before.at("run/step_2.st").size());
  {
    std::size_t i = 0;
    const auto& want = before.at("run/step_2.st");
    while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
    INFO("first difference at byte " << i);
    CHECK(i == want.size());
  }
  CHECK_THROWS_AS(s.run({{"op", "export"}, {"path", "run/step_2.st"}, {"dest", "rel"}}),
                  invalid_argument);

  // A leftover object nobody references (a crash between write and record).
  const std::string junk = "junk";
  const auto orphan = s.objects.put(
      std::vector<std::span<const std::byte>>{std::as_bytes(std::span(junk.data(), junk.size()))});
  CHECK(s.run({{"op", "verify"}})["unreferenced_objects"] == 1);
  const json dry = s.run({{"op", "gc"}, {"dry_run", true}});
  CHECK(dry["removed_objects"] == 1);
  CHECK(s.objects.disk_bytes(orphan.id) > 0);
  const json gc = s.run({{"op", "gc"}});
  CHECK(gc["removed_objects"] == 1);
  CHECK(s.objects.disk_bytes(orphan.id) == 0);
  CHECK(s.run({{"op", "gc"}})["removed_objects"] == 0);
  for (const auto& [path, data] : all_served(*s.fs))
    if (path != "other/step_3.st") CHECK(before.at(path) == data);
}

TEST_CASE("admin: verify names the files behind a flipped bit, a truncated and a missing object") {
  temp_dir tmp;
  std::map<std::string, std::uint64_t> object_of;  // path -> object id
  {
    opened s(tmp.path);
    populate(s, 3);
    for (const auto& f : s.fs->regular_files())
      object_of[f.path] = s.content.info(f.content).object;
    CHECK(s.run({{"op", "verify"}, {"deep", true}})["ok"] == true);
  }
  auto obj_path = [&](std::uint64_t id) {
    char name[32];
    std::snprintf(name, sizeof name, "%016llx.obj", static_cast<unsigned long long>(id));
    return tmp.path / "objects" / name;
  };
  {  // flipped bit in the middle of run/step_3's delta
    const auto p = obj_path(object_of.at("run/step_3.st"));
    std::fstream f(p.string(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::streamoff(bf::file_size(p) / 2));
    char c;
    f.get(c);
    f.seekp(std::streamoff(bf::file_size(p) / 2));
    f.put(char(c ^ 0x04));
  }
  bf::resize_file(obj_path(object_of.at("other/step_2.st")),
                  bf::file_size(obj_path(object_of.at("other/step_2.st"))) / 2);
  bf::remove(obj_path(object_of.at("notes.txt")));
  opened s(tmp.path);
  const json v = s.run({{"op", "verify"}});
  CHECK(v["ok"] == false);
  std::set<std::string> damaged;
  for (const auto& d : v["damaged"])
    if (d["path"].is_string()) damaged.insert(d["path"].get<std::string>());
  // other/step_3 is a delta on the truncated step_2: damaged too.
  CHECK(damaged ==
        std::set<std::string>{"run/step_3.st", "other/step_2.st", "other/step_3.st", "notes.txt"});
  // The sound files still read.
  CHECK(!served(*s.fs, "run/step_2.st").empty());
}

TEST_CASE("admin: ls counts head images live and offline, status reports what is held") {
  temp_dir tmp;
  content_options opt;
  opt.heads_dir = (tmp.path / "heads").string();
  opt.head_min = 64 << 10;  // the test's checkpoints (1.2 MB of tensors) get head images
  opt.cache_bytes = std::uint64_t(256) << 20;
  constexpr std::uint64_t buffer = std::uint64_t(4) << 20;
  json live_ls;
  {
    opened s(tmp.path, opt, buffer);
    populate(s, 3);
    s.content.wait_heads();
    live_ls = s.run({{"op", "ls"}});
    REQUIRE(live_ls["lineages"].size() == 2);
    std::uint64_t heads = 0, stored = 0;
    for (const auto& l : live_ls["lineages"]) {
      const auto& vs = l["versions"];
      REQUIRE(vs.size() == 3);
      // Only the newest version has an image, of its full logical size.
      CHECK(vs[0]["head_bytes"] == 0);
      CHECK(vs[1]["head_bytes"] == 0);
      CHECK(vs[2]["head_bytes"] == vs[2]["logical_bytes"]);
      CHECK(l["head_bytes"] == vs[2]["logical_bytes"]);
      CHECK(l["disk_bytes"].get<std::uint64_t>() ==
            l["stored_bytes"].get<std::uint64_t>() + l["head_bytes"].get<std::uint64_t>());
      heads += l["head_bytes"].get<std::uint64_t>();
      stored += l["stored_bytes"].get<std::uint64_t>();
    }
    CHECK(live_ls["files"][0]["head_bytes"] == 0);
    stored += live_ls["files"][0]["stored_bytes"].get<std::uint64_t>();
    const json& t = live_ls["totals"];
    CHECK(t["head_bytes"] == heads);
    CHECK(t["stored_bytes"] == stored);
    CHECK(t["disk_bytes"] == stored + heads);
    // The head bytes are what the image files cost.
    CHECK(dir_bytes(tmp.path / "heads") == heads);
    CHECK(heads > 0);
    const json st = s.run({{"op", "stat"}, {"path", "run/step_3.st"}});
    CHECK(st["head_bytes"] == st["logical_bytes"]);
    CHECK(s.run({{"op", "stat"}, {"path", "run/step_2.st"}})["head_bytes"] == 0);

    // No daemon information (ckptctl offline): status is refused.
    try {
      s.run({{"op", "status"}});
      FAIL("status answered without a daemon");
    } catch (const io_error& e) {
      CHECK(e.sys_errno() == ENOTCONN);
    }
    admin::daemon_info d;
    d.cache_bytes = opt.cache_bytes;
    d.buffer_bytes = buffer;
    d.store_dir = d.scratch_dir = tmp.path.string();
    d.staging_dir = (tmp.path / "staging").string();
    d.heads_dir = opt.heads_dir;
    d.heads = true;
    d.head_min = opt.head_min;
    s.admin->set_daemon(d);
    json st0 = s.run({{"op", "status"}});
    CHECK(st0["budget"]["bound_bytes"] == opt.cache_bytes + buffer + (std::uint64_t(512) << 20));
    CHECK(st0["budget"]["cache_bytes"] == opt.cache_bytes);
    CHECK(st0["budget"]["buffer_bytes"] == buffer);
    CHECK(st0["pid"] == ::getpid());
    CHECK(st0["process"]["rss_bytes"].get<std::uint64_t>() > (std::uint64_t(1) << 20));
    CHECK(st0["process"]["peak_rss_bytes"] >= st0["process"]["rss_bytes"]);
    CHECK(st0["cache"]["budget_bytes"].get<std::uint64_t>() +
              st0["cache"]["chunk_budget_bytes"].get<std::uint64_t>() ==
          opt.cache_bytes);
    CHECK(st0["cache"]["bytes"] <= st0["cache"]["budget_bytes"]);
    CHECK(st0["buffers"]["budget_bytes"] == buffer);
    CHECK(st0["buffers"]["memory_bytes"] == 0);  // all committed, the heads published
    CHECK(st0["buffers"]["spilled_bytes"] == 0);
    CHECK(st0["commits"]["queued"] == 0);
    CHECK(st0["commits"]["running"] == 0);
    CHECK(st0["encodes"]["slots"].get<std::uint64_t>() >= 2);
    CHECK(st0["encodes"]["in_use"] == 0);
    CHECK(st0["heads"]["enabled"] == true);
    CHECK(st0["heads"]["images"] == 2);
    CHECK(st0["heads"]["published"] == 2);
    CHECK(st0["heads"]["memory_bytes"] == 0);
    CHECK(st0["heads"]["disk_bytes"] == heads);
    CHECK(st0["scratch"]["bytes"] == heads);
    CHECK(st0["scratch"]["heads_dir"] == opt.heads_dir);
    CHECK(st0["scratch"]["free_bytes"].get<std::uint64_t>() > 0);

    // A file being written past buffer=: 4 MiB in memory, the rest in the staging file.
    std::vector<std::byte> big(std::size_t(24) << 20);
    std::mt19937_64 rng(1);
    for (std::size_t i = 0; i < big.size(); i += 8) {
      const std::uint64_t x = rng();
      std::memcpy(big.data() + i, &x, 8);
    }
    auto [bst, bo] = s.fs->create(root_ino, "big.bin", 0644, O_WRONLY | O_CREAT, 0, 0);
    s.fs->write(bo.fh, 0, big);
    const json mid = s.run({{"op", "status"}});
    CHECK(mid["buffers"]["memory_bytes"] == buffer);
    CHECK(mid["buffers"]["spilled_bytes"] == big.size() - buffer);
    CHECK(mid["scratch"]["bytes"] == heads + (big.size() - buffer));
    CHECK(mid["commits"]["queued"] == 0);
    // Closing it queues its commit: some status sees it queued or running, then both 0.
    s.fs->release(bo.fh);
    // (Storing 24 MiB of random bytes takes a good fraction of a second; a status costs
    // microseconds, so the running commit is seen.)
    std::uint64_t seen = 0, seen_running = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      const json c = s.run({{"op", "status"}})["commits"];
      const std::uint64_t n = c["queued"].get<std::uint64_t>() + c["running"].get<std::uint64_t>();
      seen = std::max(seen, n);
      seen_running = std::max(seen_running, c["running"].get<std::uint64_t>());
      if (n == 0 || std::chrono::steady_clock::now() > deadline) break;
    }
    CHECK(seen == 1);  // one commit, never counted twice nor lost between queued and running
    CHECK(seen_running == 1);
    s.fs->getattr(bst.st_ino);  // committed
    s.fs->forget(bst.st_ino, 1);
    const json after = s.run({{"op", "status"}});
    CHECK(after["commits"]["queued"] == 0);
    CHECK(after["commits"]["running"] == 0);
    CHECK(after["buffers"]["memory_bytes"] == 0);
    CHECK(after["buffers"]["spilled_bytes"] == 0);
    CHECK(after["buffers"]["memory_bytes"].get<std::uint64_t>() +
              after["buffers"]["pooled_bytes"].get<std::uint64_t>() <=
          buffer);
    s.run({{"op", "rm"}, {"paths", {"big.bin"}}});
  }
  // Offline (no head store): the image files the daemon left count the same...
  opened off(tmp.path);
  CHECK(off.run({{"op", "ls"}})["totals"]["head_bytes"] == 0);  // ...only when looked for
  off.admin->set_heads_on_disk((tmp.path / "heads").string());
  const json ls = off.run({{"op", "ls"}});
  CHECK(ls["totals"]["head_bytes"] == live_ls["totals"]["head_bytes"]);
  CHECK(ls["totals"]["disk_bytes"] == live_ls["totals"]["disk_bytes"]);
  for (std::size_t i = 0; i < 2; ++i)
    CHECK(ls["lineages"][i]["head_bytes"] == live_ls["lineages"][i]["head_bytes"]);
  for (const auto& l : live_ls["lineages"]) {
    const json& newest = l["versions"][2];
    const std::string path = newest["paths"][0];
    CHECK(off.run({{"op", "stat"}, {"path", path}})["head_bytes"] == newest["logical_bytes"]);
  }
  // A file that is not its version's image (another size) is not counted.
  const auto images = bf::directory_iterator(tmp.path / "heads");
  const bf::path first = images->path();
  bf::resize_file(first, bf::file_size(first) - 1);
  CHECK(off.run({{"op", "ls"}})["totals"]["head_bytes"].get<std::uint64_t>() <
        live_ls["totals"]["head_bytes"].get<std::uint64_t>());
}
