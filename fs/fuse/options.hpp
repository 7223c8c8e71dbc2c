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

// Defaults sized from the machine's memory (RAM: physical memory, sysconf): cache= is RAM/8 and
// buffer= RAM/16, each between 256 MiB (128 MiB for buffer=) and 2 GiB (1 GiB). So a 16 GiB or
// larger machine gets cache=2G,buffer=1G, an 8 GiB one cache=1G,buffer=512M, and the daemon's
// budget (cache + buffer + 512 MiB) stays under a quarter of memory plus the constant.
std::uint64_t default_cache_bytes();
std::uint64_t default_buffer_bytes();

// -o stream=on: a file is streamed once this much of it is written (fs_config::stream_after):
// past data.pkl of any checkpoint large enough to stream (head_min), and no thread for the
// small files a stream would decline.
inline constexpr std::uint64_t kStreamAfter = std::uint64_t(8) << 20;

// Lossy keyframes at the mount's default: fp32 tensors rounded to 12 mantissa bits (each element
// within 2^-13 of its value), chosen by the recovery and language-model benchmarks
// (docs/benchmarks.md, "Lossy keyframes"): 8 bits lost accuracy on LeNet-5, 12 did not.
inline constexpr int kDefaultKeyframeBits = 12;
// The mount's min_tensor (content_options::min_tensor_bytes; the library keeps 4 KiB): a delta
// of a 64-element fp32 tensor costs about 100 bytes against 256 exact (its block's header and
// table), so below that the saving goes. Coding the biases, norms' scales and their Adam state
// made the language-model benchmark 6% smaller and LeNet-5 21% (docs/benchmarks.md, "Fixed
// costs, small tensors and second moments").
inline constexpr std::uint64_t kDefaultMinTensor = 256;
// The mount's moment_bits (content_options::moment_bits): Adam's v in keyframes and on their
// chains within 2^-3 of its value, where its one-bit ratio deltas leave each element within a
// factor 2 (21% relative L2 error); the language-model benchmark 18.0x -> 19.2x, the Adam MLP
// 17.4x -> 19.2x every 10 iterations, the accuracy of both unchanged (docs/benchmarks.md,
// "Adam's m in a lineage's first keyframe, and two bits for v's keyframes"; 6 until 2026-11-28).
inline constexpr int kDefaultMomentBits = 2;
// The mount's ratio_bits (content_options::ratio_bits): Adam's v deltas with one factor, its
// escapes coded (block version 4). v's error 7% -> 21% (each element still within a factor 2),
// below the noise of Adam's own estimate at beta2 = 0.95; the language-model benchmark 25%
// smaller, the recovery benchmark's Adam MLP 11-18%, every accuracy limit held
// (docs/benchmarks.md, "Coded escapes and one bit for Adam's v").
inline constexpr int kDefaultRatioBits = 1;
// The mount's refresh_interval (content_options::refresh_interval), with keyframe_interval=auto
// (the mount's default): small checkpoints' chains run to 1000 versions instead of 20, and a
// refresh every 5 deltas keeps matrix factorisation saved every 10 iterations within its limit,
// where without refreshes it lost 1.12% of test MSE against a 1% limit (docs/benchmarks.md,
// "Long chains for small checkpoints, refreshed").
inline constexpr int kDefaultRefreshInterval = 5;

struct daemon_options {
  std::string store;
  std::string mountpoint;
  bool foreground = false;
  bool debug = false;
  bool help = false;
  bool version = false;
  // cache_bytes: default_cache_bytes(); keyframe_bits: kDefaultKeyframeBits unless set (the
  // library's own default is exact keyframes); min_tensor_bytes: kDefaultMinTensor;
  // moment_bits: kDefaultMomentBits; ratio_bits: kDefaultRatioBits; keyframe_interval: auto (0);
  // refresh_interval: kDefaultRefreshInterval.
  content_options content;
  bool keyframe_bits_set = false;  // -o keyframe_bits given (it contradicts -o lossless)
  bool grid_set = false;           // -o grid given (bits=1 refuses it)
  std::uint64_t buffer_bytes = default_buffer_bytes();
  bool direct_checkpoint_reads = true;  // -o reads=direct (default) or reads=cached
  bool heads = true;        // -o heads=auto|on|off (content.heads_always, content.head_min)
  std::string scratch;      // -o scratch=DIR: staging and heads (default STORE)
  bool passthrough = true;  // -o passthrough=on|off
  double reclaim = 1.25;    // -o reclaim=F (fs_config::rewrite_factor), 0: off
  bool stream = true;       // -o stream=on|off (fs_config::stream_after)
  std::vector<std::string> fuse_options;  // passed to libfuse as -o
};

// Throws usage_error with a message for the user.
daemon_options parse_command_line(int argc, const char* const* argv);

// "512", "64K", "2G", "1.5G" (binary units, optional trailing B/iB). Throws usage_error.
std::uint64_t parse_size(std::string_view text, std::string_view option);

std::string usage_text(std::string_view program);

}  // namespace ckpt::fs::fuse
