#pragma once
// Shared by the namespace tests.
#include "codec/error.hpp"

namespace ckpt::test {

// The errno an operation fails with (its ckpt::io_error), 0 if it succeeds.
inline int errno_of(auto&& fn) {
  try {
    fn();
  } catch (const ckpt::io_error& e) {
    return e.sys_errno();
  }
  return 0;
}

}  // namespace ckpt::test
