// `ckptctl status` underneath: VmRSS/VmHWM parsing of /proc/PID/status text, and the "status"
// request through a real control socket to an admin_service on a store opened the daemon's way
// (budget, process, buffers, heads, scratch), and refused (ENOTCONN) by a service that is not a
// daemon's.
#include <fcntl.h>
#include <unistd.h>

#include <boost/filesystem.hpp>
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "codec/error.hpp"
#include "fs/admin/admin_service.hpp"
#include "fs/admin/control_protocol.hpp"
#include "fs/admin/control_server.hpp"
#include "fs/admin/store_session.hpp"

namespace bf = boost::filesystem;
using namespace ckpt::fs;
using namespace ckpt::fs::admin;
using nlohmann::json;

namespace {

struct temp_dir {
  temp_dir() : dir(bf::temp_directory_path() / bf::unique_path("ckpt-status-%%%%%%%%")) {
    bf::create_directories(dir);
  }
  ~temp_dir() { bf::remove_all(dir); }
  bf::path dir;
};

}  // namespace

TEST_CASE("status: VmRSS and VmHWM from /proc/PID/status", "[admin]") {
  const std::string text =
      "Name:\tckptfs\nVmPeak:\t  999999 kB\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n"
      "RssAnon:\t   90000 kB\n";
  const process_memory m = parse_proc_status(text);
  CHECK(m.rss_bytes == 102400ull * 1024);
  CHECK(m.peak_rss_bytes == 204800ull * 1024);
  // Missing or malformed lines are zeros, never an exception.
  CHECK(parse_proc_status("").rss_bytes == 0);
  CHECK(parse_proc_status("VmRSS:\tlots kB\nVmHWM: 12 MB").rss_bytes == 0);
  CHECK(parse_proc_status("VmRSS:\tlots kB\nVmHWM: 12 MB").peak_rss_bytes == 0);
  CHECK(parse_proc_status("VmRSS: 7 kB").rss_bytes == 7 * 1024);  // no trailing newline
  // This process's own numbers.
  const process_memory self = read_process_memory();
  CHECK(self.rss_bytes > 0);
  CHECK(self.peak_rss_bytes >= self.rss_bytes);
}

TEST_CASE("status: answered over the control socket by a daemon's service only", "[admin]") {
  temp_dir tmp;
  const bf::path store = tmp.dir / "store", scratch = tmp.dir / "scratch";
  store_session_options so;
  so.content.cache_bytes = std::uint64_t(300) << 20;
  so.buffer_bytes = std::uint64_t(100) << 20;
  so.scratch = scratch.string();
  so.heads = true;
  store_session session(store, so);
  admin_service service(session.fs(), session.content(), session.objects());
  const std::string sock = control_socket_path(store.string());
  control_server server(sock,
                        [&](const json& r, const progress_fn& p) { return service.handle(r, p); });

  // Not a daemon's service (ckptctl offline): refused, with ENOTCONN.
  try {
    control_call(sock, {{"op", "status"}});
    FAIL("status answered without daemon information");
  } catch (const remote_error& e) {
    CHECK(e.sys_errno() == ENOTCONN);
    CHECK(std::string(e.what()).find("running daemon") != std::string::npos);
  }

  daemon_info d;
  d.cache_bytes = so.content.cache_bytes;
  d.buffer_bytes = so.buffer_bytes;
  d.store_dir = store.string();
  d.mountpoint = "/mnt/x";
  d.scratch_dir = session.scratch_dir().string();
  d.staging_dir = session.staging_dir().string();
  d.heads_dir = session.heads_dir().string();
  d.heads = true;
  d.head_min = 1 << 20;
  service.set_daemon(d);

  // A file open for writing holds buffer memory (whole 1 MiB chunks).
  auto [st, o] = session.fs().create(1, "f.bin", 0644, O_WRONLY | O_CREAT, 0, 0);
  session.fs().write(o.fh, 0, std::vector<std::byte>(std::size_t(3) << 20, std::byte{1}));
  const json r = control_call(sock, {{"op", "status"}});
  session.fs().release(o.fh);

  CHECK(r["pid"] == ::getpid());
  CHECK(r["store"] == store.string());
  CHECK(r["mountpoint"] == "/mnt/x");
  CHECK(r["budget"]["cache_bytes"] == so.content.cache_bytes);
  CHECK(r["budget"]["buffer_bytes"] == so.buffer_bytes);
  CHECK(r["budget"]["overhead_bytes"] == daemon_overhead_bytes);
  CHECK(r["budget"]["bound_bytes"] == (std::uint64_t(912) << 20));
  CHECK(r["process"]["rss_bytes"].get<std::uint64_t>() > 0);
  CHECK(r["process"]["peak_within_bound"].is_boolean());
  CHECK(r["buffers"]["budget_bytes"] == so.buffer_bytes);
  CHECK(r["buffers"]["memory_bytes"] == (std::uint64_t(3) << 20));
  CHECK(r["buffers"]["spilled_bytes"] == 0);
  CHECK(r["cache"]["budget_bytes"].get<std::uint64_t>() +
            r["cache"]["chunk_budget_bytes"].get<std::uint64_t>() ==
        so.content.cache_bytes);
  CHECK(r["heads"]["enabled"] == true);
  CHECK(r["heads"]["min_bytes"] == 1 << 20);
  CHECK(r["heads"]["images"] == 0);
  CHECK(r["scratch"]["dir"] == scratch.string());
  CHECK(r["scratch"]["staging_dir"] == (scratch / "staging").string());
  CHECK(r["scratch"]["heads_dir"] == (scratch / "heads").string());
  CHECK(r["scratch"]["bytes"] == 0);
  CHECK(bf::is_directory(scratch / "heads"));  // the daemon's heads live under scratch=
}
