#include "fs/fuse/options.hpp"

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <initializer_list>

#include <unistd.h>

#include <algorithm>

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

// `word_value` for `word` (auto, off), else parse_int; the error names both forms.
int parse_int_or(std::string_view text, std::string_view option, std::string_view word,
                 int word_value, int lo, int hi) {
  if (text == word) return word_value;
  try {
    return parse_int(text, option, lo, hi);
  } catch (const usage_error&) {
    throw usage_error("invalid value '" + std::string(text) + "' for -o " + std::string(option) +
                      " (expected " + std::string(word) + " or an integer from " +
                      std::to_string(lo) + " to " + std::to_string(hi) + ")");
  }
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

// A number for -o `option` that `ok` accepts, else a usage error ending in `expect`.
template <class Ok>
double parse_number(std::string_view text, std::string_view option, Ok ok,
                    std::string_view expect) {
  const std::string s(text);
  char* end = nullptr;
  errno = 0;
  const double v = s.empty() ? -1 : std::strtod(s.c_str(), &end);
  if (s.empty() || errno || end != s.c_str() + s.size() || !ok(v))
    throw usage_error("invalid value '" + s + "' for -o " + std::string(option) + " (" +
                      std::string(expect) + ")");
  return v;
}

// 0 (off) or a factor from 1 to 100: "1.25".
double parse_factor(std::string_view text, std::string_view option) {
  return parse_number(
      text, option, [](double v) { return v == 0 || (v >= 1 && v <= 100); },
      "0 to turn it off, or a factor from 1 to 100, e.g. 1.25");
}

// A grid step: 0 (off) or from 0.05 to 16 (times the RMS of a slab's change).
double parse_step(std::string_view text, std::string_view option) {
  return parse_number(
      text, option, [](double v) { return v == 0 || (v >= 0.05 && v <= 16); },
      "auto, off, or a step from 0.05 to 16 times the RMS of a slab's change");
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
  } else if (key == "ratio_bits") {
    need_value();
    d.content.ratio_bits = parse_int(val, key, 1, 4);
  } else if (key == "keyframe_bits") {
    need_value();
    d.content.keyframe_bits = parse_int(val, key, 0, 23);
    d.keyframe_bits_set = true;
  } else if (key == "moment_bits") {
    need_value();
    d.content.moment_bits = parse_int(val, key, 0, 23);
  } else if (key == "lossless") {
    if (eq != std::string::npos) throw usage_error("-o lossless takes no value");
    d.content.lossless = true;
  } else if (key == "keyframe_interval") {
    need_value();
    d.content.keyframe_interval = parse_int_or(val, key, "auto", 0, 1, 1000000);
  } else if (key == "refresh_interval") {
    need_value();
    d.content.refresh_interval = parse_int_or(val, key, "off", 0, 0, 1000000);
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
  } else if (key == "intra") {
    need_value();
    d.content.intra = choose(val, key, {"on", "off"}) == 0;
  } else if (key == "grid") {
    need_value();
    d.content.grid_step = val == "off"    ? 0.0
                          : val == "auto" ? content_options::kAutoGrid
                                          : parse_step(val, key);
    d.grid_set = true;
  } else if (key == "weight_error") {
    need_value();
    // A percentage with its sign, so that 0.025 (meant as a fraction) is not taken as 0.025%.
    const std::string_view expect = "off, or a percentage from 0.01% to 20%, e.g. 2.5%";
    if (val == "off" || val == "0") {
      d.content.weight_error = 0;
    } else {
      const auto refuse = [&] {
        return usage_error("invalid value '" + std::string(val) + "' for -o weight_error (" +
                           std::string(expect) + ")");
      };
      if (val.size() < 2 || val.back() != '%') throw refuse();
      try {  // the message quotes the value as given, with its sign
        d.content.weight_error = parse_number(
                                     val.substr(0, val.size() - 1), key,
                                     [](double v) { return v >= 0.01 && v <= 20; }, expect) /
                                 100;
      } catch (const usage_error&) {
        throw refuse();
      }
    }
  } else if (key == "grid_error") {
    need_value();
    d.content.grid_error = parse_number(
        val, key, [](double v) { return v >= 1 && v <= 64; }, "a factor from 1 to 64, e.g. 4");
  } else if (key == "intra_buckets") {
    need_value();
    d.content.intra_buckets = parse_int(val, key, 1, 15);
  } else if (key == "cache") {
    need_value();
    d.content.cache_bytes = parse_size(val, key);
  } else if (key == "buffer") {
    need_value();
    d.buffer_bytes = parse_size(val, key);
  } else if (key == "heads") {
    need_value();
    const int c = choose(val, key, {"auto", "on", "off"});
    d.heads = c != 2;
    d.content.heads_always = c == 1;
  } else if (key == "head_min") {
    need_value();
    d.content.head_min = parse_size(val, key);
  } else if (key == "min_tensor") {
    need_value();
    d.content.min_tensor_bytes = parse_size(val, key);
    if (d.content.min_tensor_bytes == 0) throw usage_error("-o min_tensor must be at least 1 byte");
  } else if (key == "scratch") {
    need_value();
    if (val.empty() || val[0] != '/') throw usage_error("-o scratch needs an absolute directory");
    d.scratch = std::string(val);
  } else if (key == "passthrough") {
    need_value();
    d.passthrough = choose(val, key, {"on", "off"}) == 0;
  } else if (key == "reclaim") {
    need_value();
    d.reclaim = parse_factor(val, key);
  } else if (key == "stream") {
    need_value();
    d.stream = choose(val, key, {"on", "off"}) == 0;
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

namespace {
std::uint64_t physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? std::uint64_t(pages) * std::uint64_t(page)
                               : std::uint64_t(16) << 30;
}
}  // namespace

std::uint64_t default_cache_bytes() {
  return std::clamp<std::uint64_t>(physical_memory() / 8, std::uint64_t(256) << 20,
                                   std::uint64_t(2) << 30);
}

std::uint64_t default_buffer_bytes() {
  return std::clamp<std::uint64_t>(physical_memory() / 16, std::uint64_t(128) << 20,
                                   std::uint64_t(1) << 30);
}

daemon_options parse_command_line(int argc, const char* const* argv) {
  daemon_options d;
  d.content.cache_bytes = default_cache_bytes();
  d.content.keyframe_bits = kDefaultKeyframeBits;
  d.content.min_tensor_bytes = kDefaultMinTensor;
  d.content.moment_bits = kDefaultMomentBits;
  d.content.ratio_bits = kDefaultRatioBits;
  d.content.keyframe_interval = 0;  // auto
  d.content.refresh_interval = kDefaultRefreshInterval;
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
  if (d.content.lossless && d.keyframe_bits_set && d.content.keyframe_bits)
    throw usage_error("-o lossless and -o keyframe_bits contradict each other");
  if (d.content.intra_buckets >= (1 << d.content.bits))
    throw usage_error("-o intra_buckets=" + std::to_string(d.content.intra_buckets) +
                      " is more than bits=" + std::to_string(d.content.bits) + " has (" +
                      std::to_string((1 << d.content.bits) - 1) + ")");
  if (d.grid_set && d.content.grid_step != 0 && d.content.bits < 2)
    throw usage_error("-o grid needs bits=2 or more (bits=1 has one symbol per sign)");
  if (positional.size() != 2)
    throw usage_error(positional.size() < 2 ? "missing STORE and/or MOUNTPOINT"
                                            : "too many arguments");
  d.store = positional[0];
  if (auto hash = d.store.find('#'); d.store.rfind("ckptfs#", 0) == 0)
    d.store = d.store.substr(hash + 1);
  d.mountpoint = positional[1];
  return d;
}

namespace {
std::string human(std::uint64_t bytes) {
  if (bytes % (std::uint64_t(1) << 30) == 0) return std::to_string(bytes >> 30) + "G";
  return std::to_string(bytes >> 20) + "M";
}
}  // namespace

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
         "  -o ratio_bits=N        bits for second moments' deltas (Adam's exp_avg_sq, by\n"
         "                         name), coded as ratios, each element within a factor 2;\n"
         "                         1..4 (default 1)\n"
         "  -o lossless            store every checkpoint exactly (lossless float coding)\n"
         "  -o keyframe_interval=N|auto every N-th version of a checkpoint is a keyframe;\n"
         "                         auto (default): N = 1 GiB / its size, within 20..1000\n"
         "  -o refresh_interval=N  every N-th delta after a keyframe codes the weights'\n"
         "                         changes with 4 bits (default 5); 0 or off: never\n"
         "  -o keyframe_bits=N     keyframes' float tensors rounded to N mantissa bits, each\n"
         "                         within 2^-(N+1) of its value, and the deltas on them too\n"
         "                         (default 12); 0 or 23: exact keyframes\n"
         "  -o moment_bits=N       the same for second moments (Adam's exp_avg_sq): each\n"
         "                         within 2^-(N+1) in keyframes and in the deltas on them\n"
         "                         (default 2; 0: keyframe_bits)\n"
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
         "  -o intra=on|off        on (default): a tensor its previous version predicts worse\n"
         "                         than zero does (Adam's exp_avg saved every few dozen steps)\n"
         "                         is coded as its quantised values; off: always as a delta\n"
         "  -o intra_buckets=N     buckets such a tensor keeps, 1..2^bits-1 (default\n"
         "                         2^bits-3: 5 at bits=3, and one fewer for Adam's exp_avg;\n"
         "                         fewer: smaller, less exact)\n"
         "  -o grid=auto|off|STEP  weights' deltas: auto: per slab a uniform grid (every\n"
         "                         element to the nearest multiple of a step) where it is\n"
         "                         estimated to cost fewer bits than the paper's buckets at\n"
         "                         their error; STEP: always the grid, step = STEP times\n"
         "                         the RMS of the slab's change; off: the buckets (default\n"
         "                         auto; an explicit grid needs bits>=2)\n"
         "  -o weight_error=PCT|off  with grid=auto, a weights' slab whose buckets would leave\n"
         "                         less error than PCT of its values' RMS may take a coarser\n"
         "                         grid, up to that error: smaller deltas where checkpoints\n"
         "                         come often or training moves slowly, for training that\n"
         "                         tolerates it (2.5%: a transformer 7% smaller at the same\n"
         "                         loss; matrix factorisation lost test MSE); off (default):\n"
         "                         the buckets' error everywhere\n"
         "  -o grid_error=X        the most weight_error may add: X times the buckets' mean\n"
         "                         square error, 1..64 (default 4: twice their RMS error;\n"
         "                         1: none)\n"
         "  -o min_tensor=SIZE     float tensors smaller than SIZE are stored exactly in every\n"
         "                         version, not coded (default 256)\n"
         "  -o cache=SIZE          memory for reconstructed checkpoints and decoded data\n"
         "                         (default RAM/8, from 256M to 2G: " +
         human(default_cache_bytes()) +
         " here)\n"
         "  -o buffer=SIZE         memory for files being written; more goes to the staging\n"
         "                         directory (default RAM/16, from 128M to 1G: " +
         human(default_buffer_bytes()) +
         " here).\n"
         "                         The daemon stays within cache + buffer + 512M whatever the\n"
         "                         file sizes and writers\n"
         "  -o heads=auto|on|off   auto (default): the newest version of each large checkpoint\n"
         "                         (head_min or more of tensors) is kept as a full-size image in\n"
         "                         SCRATCH/heads, so restoring it and storing the next delta\n"
         "                         decode nothing; costs the checkpoint's size on disk per\n"
         "                         lineage (counted in ckptctl ls) and its size in writes per\n"
         "                         save; none where the newest is its lineage's only live\n"
         "                         file (saved over one last.pt, save_total_limit=1): there\n"
         "                         it would be a second full copy of it, and such a\n"
         "                         lineage's saves write none either. on: there too (fast\n"
         "                         restores of the one file, twice its size on disk). off: no\n"
         "                         images (the store holds compressed bytes only), restores\n"
         "                         decode the keyframe and the deltas after it\n"
         "  -o head_min=SIZE       smallest checkpoint (compressed tensor bytes) given a head\n"
         "                         image (default 64M); smaller ones keep theirs in the cache\n"
         "  -o scratch=DIR         where staging files and head images live (default STORE);\n"
         "                         a fast local disk helps; must be an absolute path\n"
         "  -o passthrough=on|off  on (default): reads of a head image go from the kernel\n"
         "                         straight to its file (FUSE passthrough, kernel 6.9+, needs\n"
         "                         root), at the speed of a plain file; off: through the daemon\n"
         "  -o reclaim=F           rotation: when deleted versions kept only as bases below a\n"
         "                         kept delta of a checkpoint hold F times a keyframe's\n"
         "                         bytes, that delta is rewritten as a keyframe in the\n"
         "                         background and they are freed (default 1.25; a rewrite\n"
         "                         writes at most 1/F of what it frees); 0: only ckptctl prune\n"
         "  -o stream=on|off       on (default): a torch.save file or DCP shard of head_min or\n"
         "                         more is delta-coded while it is written, so that little is\n"
         "                         left for the close or fsync; off: coded after its last byte\n"
         "  -o reads=MODE          direct (default): torch checkpoints are read past the kernel\n"
         "                         page cache, from the daemon's caches into the reader's buffer\n"
         "                         (shared mmap works on kernel 6.6+, else fails: ENODEV);\n"
         "                         cached: through the page cache, kept across opens (faster for\n"
         "                         a checkpoint read many times). Other files are always cached\n"
         "  -o allow_other, ro, ...  passed to FUSE (see fuse(8)); mounted by root, the\n"
         "                         mount is shared (allow_other is added) and the kernel\n"
         "                         checks mode bits for every user (default_permissions)\n"
         "SIZE accepts K, M, G, T suffixes (powers of 1024).\n"
         "\n"
         "In the background (without -f) the daemon logs to STORE/ckptfs.log. Unmount with\n"
         "fusermount3 -u MOUNTPOINT (or ./mount.sh -u MOUNTPOINT); pending files are stored "
         "first.\n"
         "fstab: STORE MOUNTPOINT fuse.ckptfs bits=3,cache=2G 0 0\n"
         "Exit status: 0 mounted (or finished cleanly), 1 error, 2 usage error.\n";
}

}  // namespace ckpt::fs::fuse
