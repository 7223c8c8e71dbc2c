#pragma once
// Small POSIX helpers shared by the store: an owning file descriptor, errno -> io_error, full
// pread/pwrite loops, unlinked scratch files, directory fsync and little-endian field access.
// Used by fs/store/ and by the scratch files in the store's staging directory (write buffers,
// spill files).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include "codec/error.hpp"

namespace ckpt::store::detail {

// Owns one file descriptor; closes it on destruction. Move-only.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  int release() noexcept { return std::exchange(fd_, -1); }
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);  // close errors are not actionable here: data was fsynced before
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

[[noreturn]] inline void throw_errno(int err, const std::string& what) {
  throw io_error(err, what + ": " + std::strerror(err));
}

// Writes all of `data` at `offset`; throws io_error (with the errno) on failure.
inline void pwrite_all(int fd, std::span<const std::byte> data, std::uint64_t offset,
                       const std::string& what) {
  while (!data.empty()) {
    ssize_t n = ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno(errno, what);
    }
    if (n == 0) throw_errno(EIO, what);
    data = data.subspan(static_cast<std::size_t>(n));
    offset += static_cast<std::uint64_t>(n);
  }
}

// A file in `dir` that has no name: O_TMPFILE, or on filesystems without it a file created and
// unlinked at once (`prefix` names it for that moment). Throws io_error naming the directory.
inline int open_unlinked(const std::string& dir, const std::string& prefix) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::string tmpl = dir + "/" + prefix + ".XXXXXX";
    fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd < 0) throw_errno(errno, "cannot create a scratch file in " + dir);
    ::unlink(tmpl.c_str());
  }
  return fd;
}

// Reads up to out.size() bytes at `offset`; returns the count (short only at end of file).
inline std::size_t pread_full(int fd, std::span<std::byte> out, std::uint64_t offset,
                              const std::string& what) {
  std::size_t done = 0;
  while (done < out.size()) {
    ssize_t n =
        ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno(errno, what);
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

// fsync of a directory: makes creations, renames and unlinks in it durable.
inline void fsync_dir(int dir_fd, const std::string& what) {
  if (::fsync(dir_fd) != 0) throw_errno(errno, what);
}

inline void put_u16(std::byte* p, std::uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = std::byte(v >> (8 * i));
}
inline void put_u32(std::byte* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = std::byte(v >> (8 * i));
}
inline void put_u64(std::byte* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = std::byte(v >> (8 * i));
}
inline std::uint16_t get_u16(const std::byte* p) {
  return static_cast<std::uint16_t>(std::to_integer<unsigned>(p[0]) |
                                    (std::to_integer<unsigned>(p[1]) << 8));
}
inline std::uint32_t get_u32(const std::byte* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::to_integer<std::uint32_t>(p[i]) << (8 * i);
  return v;
}
inline std::uint64_t get_u64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::to_integer<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace ckpt::store::detail
