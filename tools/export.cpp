// `ckptctl export FILE DEST [--store STORE] [--json]`: writes the reconstructed bytes of FILE to
// DEST, byte-identical to reading FILE through the mount. Live, the file is read through the
// mount itself (which is the definition of those bytes); offline, the store's admin service
// reconstructs it. DEST is written whole under a temporary name, synced, then renamed into
// place, so it is never seen half-written. DEST may be a directory (DEST/basename(FILE)).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/filesystem/operations.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "codec/error.hpp"
#include "fs/admin/control_protocol.hpp"
#include "tools/commands.hpp"
#include "tools/ctl_store.hpp"

namespace bf = boost::filesystem;

namespace ckpt::tools {
namespace {

struct export_options {
  std::string path;
  std::string dest;
  std::string store;
  bool json = false;
};

[[noreturn]] void fail(int err, const std::string& what) {
  throw io_error(err, what + ": " + std::strerror(err));
}

// Removes the temporary file unless the export reached its rename.
struct temp_file {
  std::string path;
  bool keep = false;
  ~temp_file() {
    if (!keep && !path.empty()) ::unlink(path.c_str());
  }
};

// Copies FILE (inside a mount) to `dest` through the mount. Returns the byte count.
std::uint64_t export_live(const std::string& src, const std::string& dest, progress_bar& bar) {
  fs::admin::unique_fd in(::open(src.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in) fail(errno, src);
  struct stat st {};
  if (::fstat(in.get(), &st) != 0) fail(errno, src);
  if (!S_ISREG(st.st_mode)) fail(EISDIR, src);
  const bf::path d(dest);
  temp_file tmp;
  tmp.path = (d.parent_path() /
              ("." + d.filename().string() + ".ckptctl-" + std::to_string(::getpid()) + ".tmp"))
                 .string();
  fs::admin::unique_fd out(::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
  if (!out) {
    const int err = errno;
    tmp.path.clear();  // not ours
    fail(err, "cannot create " + dest);
  }
  std::vector<char> buf(std::size_t(4) << 20);
  std::uint64_t done = 0;
  const std::uint64_t total = std::uint64_t(st.st_size);
  bar.update("export", 0, total);
  for (;;) {
    const ssize_t n = ::read(in.get(), buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(errno, "cannot read " + src);
    }
    if (n == 0) break;
    for (ssize_t off = 0; off < n;) {
      const ssize_t w = ::write(out.get(), buf.data() + off, std::size_t(n - off));
      if (w < 0) {
        if (errno == EINTR) continue;
        fail(errno, "cannot write " + dest);
      }
      off += w;
    }
    done += std::uint64_t(n);
    bar.update("export", done, std::max(done, total));
  }
  if (::fsync(out.get()) != 0) fail(errno, "cannot sync " + dest);
  if (::close(out.release()) != 0) fail(errno, "cannot write " + dest);
  if (::rename(tmp.path.c_str(), dest.c_str()) != 0) fail(errno, "cannot rename onto " + dest);
  tmp.keep = true;
  bar.clear();
  return done;
}

}  // namespace

void add_export_command(CLI::App& app) {
  auto o = std::make_shared<export_options>();
  auto* cmd = app.add_subcommand("export", "Write the reconstructed file to DEST.");
  cmd->footer(
      "DEST receives exactly the bytes FILE reads as through the mount (a checkpoint "
      "reconstructed from its keyframe and deltas), written under a temporary name, synced "
      "and renamed into place. If DEST is a directory, the file keeps its name there.\n");
  cmd->add_option("FILE", o->path, "A file inside a ckptfs mount (or, with --store, in a store)")
      ->required();
  cmd->add_option("DEST", o->dest, "Where to write it (a path outside or inside the mount)")
      ->required();
  cmd->add_option("--store", o->store,
                  "Work offline on this store directory (no daemon may hold it); FILE is then "
                  "relative to the store's root, as the mount would show it");
  cmd->add_flag("--json", o->json, "Print {\"bytes\":N,\"dest\":PATH}");
  cmd->callback([o] {
    const target_path t = resolve_path(o->path, o->store, path_use::file);
    bf::path dest = bf::absolute(o->dest);
    boost::system::error_code ec;
    if (bf::is_directory(dest, ec)) dest /= bf::path(t.rel).filename();
    if (!bf::is_directory(dest.parent_path(), ec))
      throw io_error(ENOENT,
                     o->dest + ": directory " + dest.parent_path().string() + " does not exist");
    progress_bar bar;
    std::uint64_t bytes = 0;
    if (t.where.offline) {
      store_client client(t.where);
      const nlohmann::json r =
          client.call({{"op", "export"}, {"path", t.rel}, {"dest", dest.string()}}, bar);
      bytes = ju64(r, "bytes");
    } else {
      bytes = export_live(t.real, dest.string(), bar);
    }
    exit_status = 0;
    if (o->json)
      print_json({{"bytes", bytes}, {"dest", dest.string()}});
    else
      std::printf("exported %s to %s (%s)\n", o->path.c_str(), dest.c_str(),
                  human_bytes(double(bytes)).c_str());
  });
}

}  // namespace ckpt::tools
