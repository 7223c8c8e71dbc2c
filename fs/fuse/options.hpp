#pragma once
// The command line of ckptfs: `ckptfs STORE MOUNTPOINT [-f] [-d] [-o opt,...]`, --help,
// --version. ckptfs's own -o options (bits, lossless, keyframe_interval, cache, buffer) are taken
// out; the rest goes to libfuse (allow_other, ro, ...). fstab conventions: `ckptfs#STORE` as the
// source, and the generic mount options mount(8) passes (defaults, noauto, nofail, _netdev,
// user, users, x-*), which are dropped.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "fs/content/content_store.hpp"

namespace ckpt::fs::fuse {

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct daemon_options {
  std::string store;
  std::string mountpoint;
  bool foreground = false;
  bool debug = false;
  bool help = false;
  bool version = false;
  content_options content;
  std::uint64_t buffer_bytes = std::uint64_t(1) << 30;
  bool direct_checkpoint_reads = true;  // -o reads=direct (default) or reads=cached
  std::vector<std::string> fuse_options;  // passed to libfuse as -o
};

// Throws usage_error with a message for the user.
daemon_options parse_command_line(int argc, const char* const* argv);

// "512", "64K", "2G", "1.5G" (binary units, optional trailing B/iB). Throws usage_error.
std::uint64_t parse_size(std::string_view text, std::string_view option);

std::string usage_text(std::string_view program);

}  // namespace ckpt::fs::fuse
