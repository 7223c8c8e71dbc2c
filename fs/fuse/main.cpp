// ckptfs: the daemon. Parses the command line, opens the store (admin::store_session: lock, object
// store, journal, replay), mounts, serves, answers ckptctl on STORE/control.sock, and on unmount
// or SIGTERM finishes pending commits and syncs the journal before exiting 0.
//
// Background mode: the process forks *first* (so every thread is created in the daemon); the
// parent relays the daemon's stderr until the mount is up (or the daemon failed) and exits with
// the daemon's status, so `ckptfs STORE MNT` returns only once the mount answers.
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/filesystem.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "codec/error.hpp"
#include "fs/admin/admin_service.hpp"
#include "fs/admin/control_server.hpp"
#include "fs/admin/store_session.hpp"
#include "fs/content/content_store.hpp"
#include "fs/fuse/ops.hpp"
#include "fs/fuse/options.hpp"
#include "fs/fuse/reply.hpp"
#include "fs/namespace/filesystem.hpp"
#include "fs/namespace/log.hpp"

#ifndef CKPTFS_VERSION
#define CKPTFS_VERSION "0.1.0"
#endif

namespace bf = boost::filesystem;
using namespace ckpt;
using namespace ckpt::fs;

namespace {

// Background mode, daemon side: stderr goes to the parent until ready() or the process ends.
struct parent_link {
  int fd = -1;
  // The mount is up: tell the parent, then log to `log_path` from now on.
  void ready(const std::string& log_path) {
    if (fd < 0) return;
    int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    char ok = '\0';
    [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, &ok, 1);
    if (log >= 0) {
      ::dup2(log, STDERR_FILENO);
      ::close(log);
    } else {
      int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, STDERR_FILENO);
      ::close(null);
    }
    ::close(fd);
    fd = -1;
  }
};

// Background mode, parent side: relays the daemon's messages; returns the exit status.
int relay_child(pid_t child, int fd) {
  std::string all;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    all.append(buf, std::size_t(n));
  }
  ::close(fd);
  bool mounted = !all.empty() && all.back() == '\0';
  if (mounted) all.pop_back();
  [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, all.data(), all.size());
  if (mounted) return 0;
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

std::string escape_option(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == ',' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

struct session_deleter {
  void operator()(fuse_session* se) const { fuse_session_destroy(se); }
};
struct loop_config_deleter {
  void operator()(fuse_loop_config* c) const { fuse_loop_cfg_destroy(c); }
};

// Mounted for the lifetime of this object; signal handlers installed likewise.
class mounted_session {
 public:
  mounted_session(fuse_session* se, const std::string& mountpoint) : se_(se) {
    if (fuse_set_signal_handlers(se_) != 0) throw io_error(EIO, "cannot install signal handlers");
    if (fuse_session_mount(se_, mountpoint.c_str()) != 0) {
      fuse_remove_signal_handlers(se_);
      throw io_error(EIO, "cannot mount at " + mountpoint +
                              " (is it an existing directory, and is FUSE available?)");
    }
  }
  ~mounted_session() {
    fuse_session_unmount(se_);
    fuse_remove_signal_handlers(se_);
  }
  mounted_session(const mounted_session&) = delete;
  mounted_session& operator=(const mounted_session&) = delete;

 private:
  fuse_session* se_;
};

int serve(const fuse::daemon_options& opt, const std::string& program, parent_link& parent) {
  const bf::path store = bf::absolute(opt.store);
  const bf::path mnt = bf::absolute(opt.mountpoint);

  admin::store_session_options so;
  so.content = opt.content;
  so.buffer_bytes = opt.buffer_bytes;
  so.direct_checkpoint_reads = opt.direct_checkpoint_reads;
  so.scratch = opt.scratch;
  so.heads = opt.heads;
  so.rewrite_factor = opt.reclaim;
  so.stream_after = opt.stream ? fuse::kStreamAfter : 0;
  so.create = true;
  so.sweep_unrecorded = true;
  // Tests: snapshot the journal early and often (default 64 MiB).
  if (const char* c = std::getenv("CKPTFS_COMPACT_BYTES"))
    so.compact_bytes = fuse::parse_size(c, "CKPTFS_COMPACT_BYTES");
  fuse::context ctx;  // outlives the session's filesystem: its commit workers call the hooks
  // Lock, object store, journal, content store, filesystem, journal replay.
  admin::store_session session(store, so);
  filesystem& fsys = session.fs();
  const std::uint64_t records = session.replayed_records();
  admin::admin_service admin(fsys, session.content(), session.objects());
  admin::daemon_info info;  // for `ckptctl status`
  info.cache_bytes = opt.content.cache_bytes;
  info.buffer_bytes = opt.buffer_bytes;
  info.store_dir = store.string();
  info.mountpoint = mnt.string();
  info.scratch_dir = session.scratch_dir().string();
  info.staging_dir = session.staging_dir().string();
  info.heads_dir = session.heads_dir().string();
  info.heads = opt.heads;
  info.head_min = opt.content.head_min;
  admin.set_daemon(std::move(info));
  admin.set_flush_kernel([&ctx] {
    if (ctx.serving.load()) ctx.notifier->flush();
  });

  ctx.fs = &fsys;

  std::vector<std::string> fargs{program};
  if (opt.debug) fargs.push_back("-d");
  std::string o = "default_permissions,fsname=" + escape_option(store.string()) + ",subtype=ckptfs";
  // Mounted by root, the mount serves every user like a system filesystem: the kernel checks
  // mode bits (default_permissions) for everyone. An unprivileged mount serves only its owner
  // unless /etc/fuse.conf has user_allow_other and -o allow_other is given (mount.sh says so).
  bool has_allow_other = false;
  for (const auto& x : opt.fuse_options) has_allow_other |= x == "allow_other";
  if (::geteuid() == 0 && !has_allow_other) o += ",allow_other";
  for (const auto& x : opt.fuse_options) o += "," + x;
  fargs.push_back("-o");
  fargs.push_back(o);
  std::vector<char*> argv;
  for (auto& a : fargs) argv.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(int(argv.size()), argv.data());

  fuse_lowlevel_ops ops = fuse::make_ops();
  std::unique_ptr<fuse_session, session_deleter> se(
      fuse_session_new(&args, &ops, sizeof ops, &ctx));
  fuse_opt_free_args(&args);
  if (!se) throw fuse::usage_error("FUSE refused the mount options: " + o);
  ctx.session = se.get();
  ctx.notifier.emplace(se.get());
  fsys.set_invalidate_hook([&ctx](ino_t ino) {
    if (ctx.serving.load()) ctx.notifier->post(ino);
  });
  // ckptctl rm/prune remove names on a control-socket thread, possibly under the filesystem's
  // lock: only queue here (inval_notifier.hpp says why a direct kernel call could deadlock).
  fsys.set_entry_removed_hook([&ctx](ino_t dir, ino_t child, std::string_view name) {
    if (ctx.serving.load()) ctx.notifier->post_delete(dir, child, name);
  });

  int rc = 0;
  {
    // Declared before the mount, so destroyed after the unmount: a request still running then
    // (a long verify) finishes against the filesystem, which lives until shutdown() below.
    std::optional<admin::control_server> control;
    mounted_session mounted(se.get(), mnt.string());
    // Before the loop reads FUSE_INIT: the hooks negotiate passthrough there.
    std::optional<fuse::passthrough> pt;
    try {
      pt.emplace(se.get(), opt.passthrough);
      ctx.pt = &*pt;
    } catch (const std::exception& e) {
      log_error(std::string(e.what()) + "; head images are read through the daemon");
    }
    const std::string pid_file = (store / "ckptfs.pid").string();
    if (FILE* f = std::fopen(pid_file.c_str(), "w")) {
      std::fprintf(f, "%d\n", int(::getpid()));
      std::fclose(f);
    }
    // The control socket (docs/management.md). Without it the mount still works; only the live
    // mode of ckptctl does not.
    try {
      admin::control_server::options copt;
      // Answer rm/prune only once the kernel has dropped the removed names (ctx.serving is
      // still true while requests run; after close() flush returns at once).
      copt.before_reply = [&ctx] { ctx.notifier->flush(); };
      control.emplace(
          admin::control_socket_path(store.string()),
          [&admin](const nlohmann::json& req, const admin::progress_fn& progress) {
            return admin.handle(req, progress);
          },
          std::move(copt));
    } catch (const std::exception& e) {
      log_error(std::string("control socket: ") + e.what() +
                "; ckptctl can manage this store only offline");
    }
    if (parent.fd >= 0) {
      std::fprintf(stderr, "ckptfs: mounted %s at %s; logging to %s\n", store.c_str(), mnt.c_str(),
                   (store / "ckptfs.log").c_str());
      std::fflush(stderr);
      parent.ready((store / "ckptfs.log").string());
    }
    log_info("mounted " + store.string() + " at " + mnt.string() + " (pid " +
             std::to_string(::getpid()) + ", " + std::to_string(records) +
             " journal records replayed)");

    std::unique_ptr<fuse_loop_config, loop_config_deleter> loop(fuse_loop_cfg_create());
    fuse_loop_cfg_set_clone_fd(loop.get(), 0);
    fuse_loop_cfg_set_max_threads(loop.get(), 16);
    ctx.serving = true;
    rc = fuse_session_loop_mt(se.get(), loop.get());
    ctx.serving = false;
    if (control) control->stop_accepting();  // the socket goes before the mount does
    ctx.notifier->close();
    log_info("unmounting: finishing pending files");
    // ~mounted_session unmounts; pending commits finish below either way.
    bf::remove(pid_file);
  }
  ctx.notifier->join();  // after the unmount: a call stuck in the kernel has returned
  fsys.shutdown();
  log_info("clean exit");
  return rc < 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Buffers of 2 MiB and more (slabs, reconstructions kept in the cache, write-buffer chunks'
  // pools) are mapped and unmapped, never kept by malloc once freed. glibc's default raises its
  // mmap threshold to the largest such buffer freed (up to 32 MiB), after which they came from
  // per-thread arenas that keep freed memory: eight ranks saving at once held ~390 MiB the
  // budget did not count (docs/benchmarks.md, "Eight ranks sharing the cache"). Buffers reused
  // on the hot path are pooled by their owners, so this costs no page faults there.
  mallopt(M_MMAP_THRESHOLD, 2 << 20);
  const std::string program = "ckptfs";
  fuse::daemon_options opt;
  try {
    opt = fuse::parse_command_line(argc, argv);
  } catch (const fuse::usage_error& e) {
    std::fprintf(stderr, "ckptfs: %s\nTry 'ckptfs --help'.\n", e.what());
    return 2;
  }
  if (opt.help) {
    std::fputs(fuse::usage_text(program).c_str(), stdout);
    return 0;
  }
  if (opt.version) {
    std::printf("ckptfs %s (libfuse %d)\n", CKPTFS_VERSION, fuse_version());
    return 0;
  }
  {
    struct stat st {};
    if (::stat(opt.mountpoint.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      std::fprintf(stderr, "ckptfs: mountpoint %s is not an existing directory\n",
                   opt.mountpoint.c_str());
      return 1;
    }
  }

  parent_link parent;
  if (!opt.foreground) {
    int pfd[2];
    if (::pipe2(pfd, O_CLOEXEC) != 0) {
      std::perror("ckptfs: pipe");
      return 1;
    }
    // Absolute paths before chdir("/").
    opt.store = bf::absolute(opt.store).string();
    opt.mountpoint = bf::absolute(opt.mountpoint).string();
    pid_t child = ::fork();
    if (child < 0) {
      std::perror("ckptfs: fork");
      return 1;
    }
    if (child > 0) {
      ::close(pfd[1]);
      return relay_child(child, pfd[0]);
    }
    ::close(pfd[0]);
    ::setsid();
    [[maybe_unused]] int r = ::chdir("/");
    int null = ::open("/dev/null", O_RDWR);
    ::dup2(null, STDIN_FILENO);
    ::dup2(null, STDOUT_FILENO);
    ::close(null);
    ::dup2(pfd[1], STDERR_FILENO);
    parent.fd = pfd[1];
  }

  try {
    return serve(opt, program, parent);
  } catch (const fuse::usage_error& e) {
    std::fprintf(stderr, "ckptfs: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckptfs: %s\n", e.what());
    return 1;
  }
}
