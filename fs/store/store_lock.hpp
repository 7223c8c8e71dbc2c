#pragma once
// One live daemon per store: an exclusive, non-blocking flock on STORE/lock, held for the lifetime
// of this object (released by the kernel if the process dies, so a crash never wedges a store).
#include <boost/filesystem/path.hpp>

namespace ckpt::store {

class store_lock {
 public:
  // Throws ckpt::io_error(EWOULDBLOCK) with a message naming the store (and the holder's pid when
  // STORE/lock records one) if another process holds it.
  explicit store_lock(const boost::filesystem::path& store_dir);
  store_lock(store_lock&&) noexcept;
  store_lock& operator=(store_lock&&) = delete;
  store_lock(const store_lock&) = delete;
  ~store_lock();

 private:
  int fd_ = -1;
};

}  // namespace ckpt::store
