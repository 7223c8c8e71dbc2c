#pragma once
// Shared by the namespace tests: a filesystem over a real store in a temporary directory, and
// helpers to write and read whole files through it.
#include <fcntl.h>

#include <boost/filesystem.hpp>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "codec/error.hpp"
#include "fs/content/content_store.hpp"
#include "fs/namespace/filesystem.hpp"
#include "fs/store/journal.hpp"
#include "fs/store/object_store.hpp"

namespace ckpt::test {

namespace bf = boost::filesystem;
using fs::content_store;
using fs::filesystem;
using fs::fs_config;
using fs::root_ino;

// The errno an operation fails with (its ckpt::io_error), 0 if it succeeds.
inline int errno_of(auto&& fn) {
  try {
    fn();
  } catch (const ckpt::io_error& e) {
    return e.sys_errno();
  }
  return 0;
}

// One daemon's worth of objects over a store directory; destroyed in the daemon's order.
struct mounted_store {
  // objects_dir: where the objects go (default dir/objects), e.g. a small tmpfs.
  explicit mounted_store(const bf::path& dir, std::uint64_t buffer = 64 << 20,
                         const bf::path& objects_dir = {})
      : objects(objects_dir.empty() ? dir / "objects" : objects_dir),
        journal(dir / "journal"),
        content(objects, journal, {}) {
    bf::create_directories(dir / "staging");
    fs_config cfg;
    cfg.store_dir = dir.string();
    cfg.staging_dir = (dir / "staging").string();
    cfg.buffer_bytes = buffer;
    fs = std::make_unique<filesystem>(journal, content, cfg);
    journal.replay([&](std::span<const std::byte> r) {
      if (!content.apply(r)) fs->replay_record(r);
    });
    fs->replay_done();
  }
  ~mounted_store() { fs.reset(); }

  store::object_store objects;
  store::journal journal;
  content_store content;
  std::unique_ptr<filesystem> fs;
};

struct temp_store {
  temp_store() : dir(bf::temp_directory_path() / bf::unique_path("ckpt-ns-%%%%%%%%")) {
    bf::create_directories(dir);
  }
  ~temp_store() { bf::remove_all(dir); }
  bf::path dir;
};

inline std::vector<std::byte> bytes(std::string_view s) {
  auto b = std::as_bytes(std::span(s.data(), s.size()));
  return {b.begin(), b.end()};
}

inline std::string read_all(filesystem& fs, ino_t ino) {
  auto h = fs.open(ino, O_RDONLY).fh;
  std::string out;
  std::vector<std::byte> buf(1 << 16);
  for (std::uint64_t off = 0;;) {
    std::size_t n = fs.read(h, off, buf);
    if (n == 0) break;
    out.append(reinterpret_cast<const char*>(buf.data()), n);
    off += n;
  }
  fs.release(h);
  return out;
}

inline ino_t write_file(filesystem& fs, ino_t dir, const std::string& name,
                        const std::string& data) {
  auto [st, o] = fs.create(dir, name, 0644, O_WRONLY | O_CREAT, 0, 0);
  fs.write(o.fh, 0, bytes(data));
  fs.flush(o.fh);
  fs.release(o.fh);  // the commit runs on a worker
  return st.st_ino;
}

}  // namespace ckpt::test
