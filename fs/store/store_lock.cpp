// Store lock: flock(LOCK_EX|LOCK_NB) on STORE/lock. flock (not fcntl/POSIX locks) because it
// belongs to the open file description: closing some other fd of the same file in this process
// (a POSIX-lock pitfall) does not drop it, and the kernel drops it when the process dies.
// A fork()ed child that does not exec shares the description and so keeps the lock alive while
// it runs; the fd is O_CLOEXEC so exec'd helpers do not.
#include "fs/store/store_lock.hpp"

#include <sys/file.h>

#include <boost/filesystem/operations.hpp>
#include <cstdio>
#include <string>
#include <utility>

#include "fs/store/posix.hpp"

namespace ckpt::store {

using detail::throw_errno;
using detail::unique_fd;

store_lock::store_lock(const boost::filesystem::path& store_dir) {
  boost::system::error_code ec;
  boost::filesystem::create_directories(store_dir, ec);  // an existing dir is fine; open reports
  const std::string file = (store_dir / "lock").string();
  unique_fd fd(::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd) throw_errno(errno, "cannot open store lock " + file);
  while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) throw_errno(errno, "cannot lock store " + store_dir.string());
    // The holder writes its pid right after locking; it may not have yet (then "unknown").
    char buf[32] = {};
    ssize_t n = ::pread(fd.get(), buf, sizeof buf - 1, 0);
    long pid = 0;
    if (n > 0) pid = std::strtol(buf, nullptr, 10);
    const std::string who = pid > 0 ? "pid " + std::to_string(pid) : "pid unknown";
    throw io_error(EWOULDBLOCK,
                   "store " + store_dir.string() + " is in use by another ckptfs (" + who + ")");
  }
  // Record the holder for the message above. Informational only: no fsync (a stale pid after a
  // crash is harmless, the lock itself is what counts).
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd.get(), 0) != 0) throw_errno(errno, "cannot write store lock " + file);
  detail::pwrite_all(fd.get(), std::as_bytes(std::span(pid.data(), pid.size())), 0,
                     "cannot write store lock " + file);
  fd_ = fd.release();
}

store_lock::store_lock(store_lock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}

store_lock::~store_lock() {
  // Closing the last fd of the description releases the flock. The pid stays in the file; the
  // next holder overwrites it, and a reader only trusts it while the lock is held.
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace ckpt::store
