#include "codec/format/source.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "codec/error.hpp"

namespace ckpt::format {

void source::read(std::uint64_t offset, std::span<std::byte> out) const {
  if (offset > size_ || out.size() > size_ - offset)
    throw corrupt_error("read beyond end of file: offset " + std::to_string(offset) + " length " +
                        std::to_string(out.size()) + " size " + std::to_string(size_));
  if (!out.empty()) read_(offset, out);
}

std::vector<std::byte> source::read(std::uint64_t offset, std::uint64_t length) const {
  if (offset > size_ || length > size_ - offset)
    throw corrupt_error("read beyond end of file: offset " + std::to_string(offset) + " length " +
                        std::to_string(length) + " size " + std::to_string(size_));
  std::vector<std::byte> out(length);
  read(offset, out);
  return out;
}

source source::slice(std::uint64_t offset, std::uint64_t length) const {
  if (offset > size_ || length > size_ - offset) throw corrupt_error("slice beyond end of file");
  return source(length, [inner = read_, offset](std::uint64_t off, std::span<std::byte> out) {
    inner(offset + off, out);
  });
}

source memory_source(std::span<const std::byte> bytes) {
  return source(bytes.size(), [bytes](std::uint64_t off, std::span<std::byte> out) {
    std::memcpy(out.data(), bytes.data() + off, out.size());
  });
}

namespace {

struct fd_owner {
  int fd = -1;
  explicit fd_owner(int f) : fd(f) {}
  fd_owner(const fd_owner&) = delete;
  fd_owner& operator=(const fd_owner&) = delete;
  ~fd_owner() {
    if (fd >= 0) ::close(fd);
  }
};

[[noreturn]] void throw_errno(const std::string& what) {
  throw error(errc::io, what + ": " + std::strerror(errno));
}

}  // namespace

source file_source(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno(path);
  auto owner = std::make_shared<fd_owner>(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_errno(path);
  if (!S_ISREG(st.st_mode)) throw error(errc::io, path + ": not a regular file");
  return source(std::uint64_t(st.st_size), [owner, path](std::uint64_t off,
                                                         std::span<std::byte> out) {
    std::size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::pread(owner->fd, out.data() + done, out.size() - done, off_t(off + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw_errno(path);
      }
      if (n == 0) throw error(errc::io, path + ": file shrank while reading");
      done += std::size_t(n);
    }
  });
}

}  // namespace ckpt::format
