// ckptctl's store-independent helpers (ctl_util.hpp).
#include "tools/ctl_util.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <vector>

namespace ckpt::tools {

double parse_duration(std::string_view text) {
  const std::string shown(text);
  if (text.empty()) throw usage_error("empty duration");
  if (text == "0") return 0;
  double total = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t start = i;
    bool dot = false;
    while (i < text.size() && ((text[i] >= '0' && text[i] <= '9') || (text[i] == '.' && !dot))) {
      if (text[i] == '.') dot = true;
      ++i;
    }
    if (i == start || (i - start == 1 && dot))
      throw usage_error("bad duration '" + shown + "': expected a number, e.g. 30s, 15m, 2h, 7d");
    const double value = std::stod(std::string(text.substr(start, i - start)));
    if (i == text.size())
      throw usage_error("bad duration '" + shown + "': the number needs a unit (s, m, h, d, w)");
    double unit = 0;
    switch (text[i]) {
      case 's':
        unit = 1;
        break;
      case 'm':
        unit = 60;
        break;
      case 'h':
        unit = 3600;
        break;
      case 'd':
        unit = 86400;
        break;
      case 'w':
        unit = 7 * 86400;
        break;
      default:
        throw usage_error("bad duration '" + shown + "': unknown unit '" + std::string(1, text[i]) +
                          "' (use s, m, h, d or w)");
    }
    ++i;
    total += value * unit;
  }
  if (!std::isfinite(total)) throw usage_error("bad duration '" + shown + "': too large");
  return total;
}

std::string normalize_store_path(std::string_view path) {
  std::vector<std::string_view> parts;
  std::size_t i = 0;
  while (i <= path.size()) {
    std::size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    const std::string_view part = path.substr(i, j - i);
    if (part == "..") {
      if (parts.empty())
        throw usage_error("'" + std::string(path) + "' climbs above the root of the store");
      parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    i = j + 1;
  }
  std::string out;
  for (const auto& p : parts) {
    if (!out.empty()) out += '/';
    out += p;
  }
  return out;
}

std::string plural(std::uint64_t n, std::string_view word) {
  return std::to_string(n) + " " + std::string(word) + (n == 1 ? "" : "s");
}

std::string human_bytes(double bytes) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
  return buf;
}

std::string ratio_text(double logical, double stored) {
  if (stored <= 0) return "-";
  char buf[32];
  const double r = logical / stored;
  std::snprintf(buf, sizeof buf, r >= 100 ? "%.0fx" : "%.1fx", r);
  return buf;
}

std::string percent_text(double fraction) {
  if (std::isinf(fraction)) return "inf";
  const double p = fraction * 100;
  char buf[32];
  if (p == 0)
    return "0%";
  else if (p >= 10)
    std::snprintf(buf, sizeof buf, "%.0f%%", p);
  else if (p >= 1)
    std::snprintf(buf, sizeof buf, "%.1f%%", p);
  else
    std::snprintf(buf, sizeof buf, "%.2g%%", p);
  return buf;
}

std::string time_text(double unix_seconds) {
  if (unix_seconds <= 0) return "-";
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string text_table::render(const std::string& indent) const {
  std::vector<std::size_t> width(header_.size(), 0);
  const auto measure = [&](const std::vector<std::string>& row) {
    for (std::size_t i = 0; i < row.size() && i < width.size(); ++i)
      width[i] = std::max(width[i], row[i].size());
  };
  measure(header_);
  for (const auto& r : rows_) measure(r);
  std::string out;
  const auto emit = [&](const std::vector<std::string>& row) {
    std::string line = indent;
    for (std::size_t i = 0; i < width.size(); ++i) {
      const std::string cell = i < row.size() ? row[i] : std::string();
      const bool last = i + 1 == width.size();
      const bool right = i < right_.size() && right_[i];
      const std::size_t pad = width[i] - std::min(width[i], cell.size());
      if (right) line.append(pad, ' ');
      line += cell;
      if (!right && !last) line.append(pad, ' ');
      if (!last) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  };
  emit(header_);
  for (const auto& r : rows_) emit(r);
  return out;
}

namespace {

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape_mountinfo(std::string_view s) {
  const auto oct = [](char c) { return c >= '0' && c <= '7'; };
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && oct(s[i + 1]) && oct(s[i + 2]) && oct(s[i + 3])) {
      out += char(((s[i + 1] - '0') << 6) | ((s[i + 2] - '0') << 3) | (s[i + 3] - '0'));
      i += 3;
      continue;
    }
    out += s[i];
  }
  return out;
}

}  // namespace

std::optional<mount_entry> parse_mountinfo_line(std::string_view line) {
  // id parent major:minor root mount_point options [optional fields...] - fstype source super
  std::vector<std::string_view> f;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    std::size_t j = i;
    while (j < line.size() && line[j] != ' ') ++j;
    if (j > i) f.push_back(line.substr(i, j - i));
    i = j;
  }
  std::size_t dash = 6;
  while (dash < f.size() && f[dash] != "-") ++dash;
  if (f.size() < 6 || dash + 2 >= f.size()) return std::nullopt;
  mount_entry e;
  e.root = unescape_mountinfo(f[3]);
  e.mount_point = unescape_mountinfo(f[4]);
  e.fstype = std::string(f[dash + 1]);
  e.source = unescape_mountinfo(f[dash + 2]);
  return e;
}

std::optional<std::string> find_ckptfs_mount(const std::string& store_dir) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    auto e = parse_mountinfo_line(line);
    if (e && e->fstype == "fuse.ckptfs" && e->source == store_dir) return e->mount_point;
  }
  return std::nullopt;
}

progress_bar::progress_bar() : enabled_(::isatty(STDERR_FILENO) == 1) {}

std::string progress_bar::render(std::string_view phase, std::uint64_t done, std::uint64_t total,
                                 int width) {
  const double frac = total ? std::min(1.0, double(done) / double(total)) : 1.0;
  const int filled = int(frac * width + 0.5);
  std::string s(phase);
  if (s.size() < 8) s.resize(8, ' ');
  s += " [";
  s.append(std::size_t(filled), '#');
  s.append(std::size_t(width - filled), '.');
  char pct[16];
  std::snprintf(pct, sizeof pct, "] %3d%%  ", int(frac * 100));
  s += pct;
  if (total > 100000)
    s += human_bytes(double(done)) + " / " + human_bytes(double(total));
  else
    s += std::to_string(done) + " / " + std::to_string(total);
  return s;
}

void progress_bar::update(std::string_view phase, std::uint64_t done, std::uint64_t total) {
  if (!enabled_) return;
  std::lock_guard lk(mu_);
  const auto now = std::chrono::steady_clock::now();
  const bool new_phase = phase != last_phase_;
  if (!new_phase && done < total && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  last_phase_ = phase;
  const std::string line = "\r\033[K" + render(phase, done, total);
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  shown_ = true;
}

void progress_bar::clear() {
  if (!enabled_) return;
  std::lock_guard lk(mu_);
  if (!shown_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  shown_ = false;
}

}  // namespace ckpt::tools
