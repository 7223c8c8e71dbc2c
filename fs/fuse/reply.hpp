#pragma once
// The one error boundary of the daemon: every FUSE op body runs inside guarded(), which turns a
// thrown ckpt::io_error / ckpt::error / std::system_error / std::bad_alloc into exactly one
// fuse_reply_err and, for unexpected errors, a log line. A body replies itself on success, as its
// last statement, so every request gets exactly one reply.
#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <string>
#include <system_error>

#include "codec/error.hpp"
#include "fs/namespace/log.hpp"

namespace ckpt::fs::fuse {

// Errors that are answers, not incidents: no log line for these.
inline bool expected_errno(int err) {
  switch (err) {
    case ENOENT:
    case EEXIST:
    case ENOTEMPTY:
    case ENOTDIR:
    case EISDIR:
    case ENODATA:
    case ERANGE:
    case EINVAL:
    case EPERM:
    case EACCES:
    case ENAMETOOLONG:
    case EXDEV:
    case EBADF:
    case ENOTSUP:
    case E2BIG:
    case ENXIO:
    case EFBIG:
      return true;
    default:
      return false;
  }
}

inline void reply_error(fuse_req_t req, const char* op, int err, const char* what) {
  if (!expected_errno(err))
    log_error(std::string(op) + ": " + what + " (" + std::strerror(err) + ")");
  fuse_reply_err(req, err);
}

// Work after the reply (the request is gone): it must not throw into guarded(), which would
// reply a second time to a freed request. Failures are logged.
template <class Cleanup>
void after_reply(const char* op, Cleanup&& cleanup) noexcept {
  try {
    cleanup();
  } catch (const std::exception& e) {
    log_error(std::string(op) + ": cleanup after the reply: " + e.what());
  } catch (...) {
    log_error(std::string(op) + ": cleanup after the reply failed");
  }
}

template <class Body>
void guarded(fuse_req_t req, const char* op, Body&& body) noexcept {
  try {
    body();
  } catch (const io_error& e) {
    reply_error(req, op, e.sys_errno() ? e.sys_errno() : EIO, e.what());
  } catch (const error& e) {
    reply_error(req, op, e.code() == errc::invalid ? EINVAL : EIO, e.what());
  } catch (const std::system_error& e) {
    reply_error(req, op, e.code().value() ? e.code().value() : EIO, e.what());
  } catch (const std::bad_alloc&) {
    reply_error(req, op, ENOMEM, "out of memory");
  } catch (const std::exception& e) {
    reply_error(req, op, EIO, e.what());
  } catch (...) {
    reply_error(req, op, EIO, "unknown exception");
  }
}

}  // namespace ckpt::fs::fuse
