#include "fs/content/spill_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "codec/error.hpp"

namespace ckpt::fs {
namespace {

[[noreturn]] void fail(int err, const std::string& what) {
  throw io_error(err, what + ": " + std::strerror(err));
}

}  // namespace

spill_file::spill_file(const std::string& dir) {
  fd_ = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd_ < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    std::string tmpl = dir + "/spill.XXXXXX";
    fd_ = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd_ >= 0) ::unlink(tmpl.c_str());
  }
  if (fd_ < 0) fail(errno, "cannot create a spill file in " + dir);
}

spill_file::~spill_file() {
  if (fd_ >= 0) ::close(fd_);
}

std::uint64_t spill_file::append(std::span<const std::byte> bytes) {
  const std::uint64_t at = size_;
  for (std::size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done, off_t(at + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(n < 0 ? errno : ENOSPC, "spill file write");
    done += std::size_t(n);
  }
  size_ += bytes.size();
  return at;
}

spill_file::mapping::mapping(const spill_file& f) : size_(std::size_t(f.size_)) {
  if (!size_) return;
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, f.fd_, 0);
  if (p == MAP_FAILED) fail(errno, "cannot map a spill file");
  ::madvise(p, size_, MADV_SEQUENTIAL);  // read once, front to back: drop pages behind
  data_ = static_cast<const std::byte*>(p);
}

spill_file::mapping::~mapping() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
}

}  // namespace ckpt::fs
