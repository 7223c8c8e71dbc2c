#pragma once
// Typed errors thrown by the libraries. The one error boundary of the daemon (fs/) and the CLI
// maps them to errno / exit codes; library code never returns error codes.
#include <stdexcept>
#include <string>

namespace ckpt {

enum class errc {
  corrupt,      // stored bytes fail a checksum, a header or a length check (-> EIO)
  invalid,      // bad argument or option from a caller (-> EINVAL)
  unsupported,  // well-formed but of a version or kind this build does not know (-> EIO)
  io,           // the operating system refused (-> the errno carried)
};

class error : public std::runtime_error {
 public:
  error(errc code, const std::string& what) : std::runtime_error(what), code_(code) {}
  errc code() const noexcept { return code_; }

 private:
  errc code_;
};

// Stored bytes are damaged or inconsistent: decoding refuses instead of guessing.
class corrupt_error : public error {
 public:
  explicit corrupt_error(const std::string& what) : error(errc::corrupt, what) {}
};

// The operating system refused (write, fsync, open...): carries the errno for the FUSE boundary.
class io_error : public error {
 public:
  io_error(int sys_errno, const std::string& what) : error(errc::io, what), errno_(sys_errno) {}
  int sys_errno() const noexcept { return errno_; }

 private:
  int errno_;
};

class invalid_argument : public error {
 public:
  explicit invalid_argument(const std::string& what) : error(errc::invalid, what) {}
};

}  // namespace ckpt
