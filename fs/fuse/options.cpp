#include "fs/fuse/options.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <initializer_list>

namespace ckpt::fs::fuse {
namespace {

std::vector<std::string> split_commas(std::string_view s) {
  std::vector<std::string> out;
  std::string cur;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      cur += s[i];
      cur += s[++i];
    } else if (s[i] == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += s[i];
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

int parse_int(std::string_view text, std::string_view option, int lo, int hi) {
  int v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || v < lo || v > hi)
    throw usage_error("invalid value '" + std::string(text) + "' for -o " + std::string(option) +
                      " (expected an integer from " + std::to_string(lo) + " to " +
                      std::to_string(hi) + ")");
  return v;
}

// Index of `text` among `choices`, or usage_error listing them.
int choose(std::string_view text, std::string_view option,
           std::initializer_list<std::string_view> choices) {
  int i = 0;
  std::string list;
  for (auto c : choices) {
    if (c == text) return i;
    list += (i++ ? ", " : "") + std::string(c);
  }
  throw usage_error("invalid value '" + std::string(text) + "' for -o " + std::string(option) +
                    " (expected one of: " + list + ")");
}

bool dropped_mount_option(std::string_view o) {
  return o == "defaults" || o == "auto" || o == "noauto" || o == "nofail" || o == "_netdev" ||
         o == "user" || o == "users" || o == "nouser" || o.rfind("x-", 0) == 0 ||
         o.rfind("comment=", 0) == 0;
}

void take_option(daemon_options& d, const std::string& o) {
  auto eq = o.find('=');
  std::string key = o.substr(0, eq);
  std::string_view val =
      eq == std::string::npos ? std::string_view() : std::string_view(o).substr(eq + 1);
  auto need_value = [&] {
    if (eq == std::string::npos)
      throw usage_error("-o " + key + " needs a value (" + key + "=...)");
  };
  if (key == "bits") {
    need_value();
    d.content.bits = parse_int(val, key, 1, 4);
  } else if (key == "lossless") {
    if (eq != std::string::npos) throw usage_error("-o lossless takes no value");
    d.content.lossless = true;
  } else if (key == "keyframe_interval") {
    need_value();
    d.content.keyframe_interval = parse_int(val, key, 1, 1000000);
  } else if (key == "coding") {
    need_value();
    d.content.paper_coding = choose(val, key, {"grouped", "paper"}) == 1;
  } else if (key == "rep") {
    need_value();
    d.content.rep = choose(val, key, {"mean", "midrange"}) == 1 ? codec::representative::midrange
                                                                : codec::representative::mean;
  } else if (key == "scope") {
    need_value();
    d.content.scope = choose(val, key, {"tensor", "checkpoint"}) == 1
                          ? codec::bucket_scope::checkpoint
                          : codec::bucket_scope::tensor;
  } else if (key == "optimizer") {
    need_value();
    d.content.exact_optimizer = choose(val, key, {"lossy", "exact"}) == 1;
  } else if (key == "relative") {
    need_value();
    d.content.relative = choose(val, key, {"on", "off"}) == 0;
  } else if (key == "cache") {
    need_value();
    d.content.cache_bytes = parse_size(val, key);
  } else if (key == "buffer") {
    need_value();
    d.buffer_bytes = parse_size(val, key);
  } else if (key == "reads") {
    need_value();
    d.direct_checkpoint_reads = choose(val, key, {"direct", "cached"}) == 0;
  } else if (!dropped_mount_option(o)) {
    d.fuse_options.push_back(o);
  }
}

}  // namespace

std::uint64_t parse_size(std::string_view text, std::string_view option) {
  auto bad = [&] {
    return usage_error("invalid size '" + std::string(text) + "' for -o " + std::string(option) +
                       " (examples: 512M, 2G, 1048576)");
  };
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) throw bad();
  double number = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + i, number);
  if (ec != std::errc() || p != text.data() + i) throw bad();
  std::string unit(text.substr(i));
  for (auto& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() > 1 && (unit.ends_with("IB")))
    unit.resize(unit.size() - 2);
  else if (unit.size() > 1 && unit.back() == 'B')
    unit.pop_back();
  double mult = 1;
  if (unit.empty() || unit == "B")
    mult = 1;
  else if (unit == "K")
    mult = 1024.0;
  else if (unit == "M")
    mult = 1024.0 * 1024;
  else if (unit == "G")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "T")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    throw bad();
  double bytes = std::floor(number * mult);
  if (!(bytes >= 0) || bytes > 9.0e18) throw bad();
  return std::uint64_t(bytes);
}

daemon_options parse_command_line(int argc, const char* const* argv) {
  daemon_options d;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "-h" || a == "--help") {
      d.help = true;
    } else if (a == "-V" || a == "--version") {
      d.version = true;
    } else if (a == "-f") {
      d.foreground = true;
    } else if (a == "-d" || a == "--debug") {
      d.debug = d.foreground = true;
    } else if (a == "-o") {
      if (i + 1 >= argc) throw usage_error("-o needs an option list");
      for (const auto& o : split_commas(argv[++i])) take_option(d, o);
    } else if (a.rfind("-o", 0) == 0) {
      for (const auto& o : split_commas(a.substr(2))) take_option(d, o);
    } else if (!a.empty() && a[0] == '-') {
      throw usage_error("unknown option '" + std::string(a) + "'");
    } else {
      positional.emplace_back(a);
    }
  }
  if (d.help || d.version) return d;
  if (positional.size() != 2)
    throw usage_error(positional.size() < 2 ? "missing STORE and/or MOUNTPOINT"
                                            : "too many arguments");
  d.store = positional[0];
  if (auto hash = d.store.find('#'); d.store.rfind("ckptfs#", 0) == 0)
    d.store = d.store.substr(hash + 1);
  d.mountpoint = positional[1];
  return d;
}

std::string usage_text(std::string_view program) {
  std::string p(program);
  return "usage: " + p +
         " STORE MOUNTPOINT [-f] [-d] [-o opt[,opt...]]\n"
         "       " +
         p +
         " --help | --version\n"
         "\n"
         "Mounts the ckptfs store in directory STORE at MOUNTPOINT. Checkpoints written there are\n"
         "stored as compressed deltas; every other file is stored exactly.\n"
         "\n"
         "options:\n"
         "  -f                     stay in the foreground (log to stderr)\n"
         "  -d                     debug: foreground, and log every FUSE request\n"
         "  -o bits=N              bits per changed element, 1..4 (default 3)\n"
         "  -o lossless            store every checkpoint exactly (lossless float coding)\n"
         "  -o keyframe_interval=N every N-th version of a checkpoint is a keyframe (default 20)\n"
         "  -o coding=MODE         grouped (default): symbol groups, best entropy coder per "
         "block;\n"
         "                         paper: LC-Checkpoint's one Huffman code word per element\n"
         "  -o rep=R               bucket representative: midrange ((max+min)/2) (default)\n"
         "                         or mean\n"
         "  -o scope=S             buckets per tensor (default) or per checkpoint (the paper's)\n"
         "  -o optimizer=M         lossy (default): Adam moments, momentum buffers... coded\n"
         "                         like the weights; exact: stored losslessly in every version\n"
         "  -o relative=on|off     on (default): tensors that are never negative (Adam's\n"
         "                         exp_avg_sq) are coded as relative changes, which keeps them\n"
         "                         within a bounded factor of their value; off: as differences\n"
         "  -o cache=SIZE          memory for reconstructed checkpoints (default 2G)\n"
         "  -o buffer=SIZE         memory for files being written; more spills to STORE/staging\n"
         "                         (default 1G)\n"
         "  -o reads=MODE          direct (default): torch checkpoints are read past the kernel\n"
         "                         page cache, from the daemon's caches into the reader's buffer\n"
         "                         (shared mmap of them fails with ENODEV; private works);\n"
         "                         cached: through the page cache, kept across opens (faster for\n"
         "                         a checkpoint read many times). Other files are always cached\n"
         "  -o allow_other, ro, ...  passed to FUSE (see fuse(8))\n"
         "SIZE accepts K, M, G, T suffixes (powers of 1024).\n"
         "\n"
         "In the background (without -f) the daemon logs to STORE/ckptfs.log. Unmount with\n"
         "fusermount3 -u MOUNTPOINT (or ./mount.sh -u MOUNTPOINT); pending files are stored "
         "first.\n"
         "fstab: STORE MOUNTPOINT fuse.ckptfs bits=3,cache=2G 0 0\n"
         "Exit status: 0 mounted (or finished cleanly), 1 error, 2 usage error.\n";
}

}  // namespace ckpt::fs::fuse
