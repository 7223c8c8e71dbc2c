#pragma once
// Internal to fs/namespace: throwing an errno, and the errno of a caught exception.
#include <cerrno>
#include <new>
#include <string>
#include <system_error>

#include "codec/error.hpp"

namespace ckpt::fs {

[[noreturn]] inline void fail(int err, const std::string& what) {
  throw io_error(err, what);
}

// The errno that reports `e` to a client (a failed commit is reported on the next flush/fsync).
inline int errno_of(const std::exception& e) {
  if (auto* io = dynamic_cast<const io_error*>(&e)) return io->sys_errno() ? io->sys_errno() : EIO;
  if (dynamic_cast<const std::bad_alloc*>(&e)) return ENOMEM;
  if (auto* se = dynamic_cast<const std::system_error*>(&e)) return se->code().value();
  return EIO;
}

}  // namespace ckpt::fs
