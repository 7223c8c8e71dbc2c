#pragma once
// Helpers for the store tests: a temporary directory, a small tmpfs mount (for ENOSPC), random
// bytes, and file surgery (flip a bit, truncate).
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

#include <boost/filesystem.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace ckpt::test {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class temp_dir {
 public:
  temp_dir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ckpt-store-test-XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    boost::system::error_code ec;
    boost::filesystem::remove_all(path_, ec);
  }
  const boost::filesystem::path& path() const { return path_; }

 private:
  boost::filesystem::path path_;
};

// A tmpfs of `size` mounted on a fresh directory; unmounted (and the directory removed) on
// destruction, also when a test fails. ok() is false (with reason()) if mounting is not allowed
// here (not root, no CAP_SYS_ADMIN): the caller skips with a printed reason.
class tmpfs_mount {
 public:
  explicit tmpfs_mount(const std::string& size = "1m") {
    const std::string opts = "size=" + size + ",mode=0755";
    if (::mount("tmpfs", dir_.path().c_str(), "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()) != 0) {
      reason_ = std::string("mount -t tmpfs failed: ") + std::strerror(errno);
      return;
    }
    mounted_ = true;
  }
  tmpfs_mount(const tmpfs_mount&) = delete;
  tmpfs_mount& operator=(const tmpfs_mount&) = delete;
  ~tmpfs_mount() {
    if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  bool ok() const { return mounted_; }
  const std::string& reason() const { return reason_; }
  const boost::filesystem::path& path() const { return dir_.path(); }

 private:
  temp_dir dir_;  // declared first: removed after the unmount
  bool mounted_ = false;
  std::string reason_;
};

inline std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(seed);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t x = rng();
    std::memcpy(v.data() + i, &x, 8);
  }
  for (; i < n; ++i) v[i] = std::byte(rng());
  return v;
}

inline void flip_bit(const boost::filesystem::path& file, std::uint64_t offset, int bit = 0) {
  int fd = ::open(file.c_str(), O_RDWR);
  if (fd < 0) throw std::runtime_error("open " + file.string());
  unsigned char c;
  if (::pread(fd, &c, 1, static_cast<off_t>(offset)) != 1) throw std::runtime_error("pread");
  c ^= static_cast<unsigned char>(1u << bit);
  if (::pwrite(fd, &c, 1, static_cast<off_t>(offset)) != 1) throw std::runtime_error("pwrite");
  ::close(fd);
}

inline void truncate_file(const boost::filesystem::path& file, std::uint64_t size) {
  if (::truncate(file.c_str(), static_cast<off_t>(size)) != 0)
    throw std::runtime_error("truncate " + file.string());
}

// Fills the filesystem of `dir` with a file until at most `leave` bytes remain free.
inline void fill_fs(const boost::filesystem::path& dir, std::uint64_t leave) {
  auto sp = boost::filesystem::space(dir);
  if (sp.available <= leave) return;
  std::vector<char> chunk(64 * 1024, 'x');
  int fd = ::open((dir / "filler").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  std::uint64_t todo = sp.available - leave;
  while (todo > 0) {
    std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(todo, chunk.size()));
    ssize_t w = ::write(fd, chunk.data(), n);
    if (w <= 0) break;
    todo -= static_cast<std::uint64_t>(w);
  }
  ::close(fd);
}

}  // namespace ckpt::test
