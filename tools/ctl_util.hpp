#pragma once
// Small pieces of ckptctl's management commands that need no store: argument parsing (durations,
// paths inside the store's namespace), formatting (sizes, times) and the progress bar. Kept in a
// library of their own so tests/unit/admin_*.cpp can test them.
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt::tools {

// A command line the user got wrong (bad value, impossible combination): ckptctl prints the
// message and exits 2, like a CLI11 parse error.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "30s", "15m", "2h", "7d", "1w", decimals ("1.5h") and sums ("1h30m") -> seconds. A bare "0" is
// zero; any other number needs a unit. Throws usage_error.
double parse_duration(std::string_view text);

// A path inside the mount as the user wrote it for offline mode ("run1/step_5.pt",
// "/run1/../run1/", ".") -> the service's form: '/'-separated, no leading or trailing slash,
// no "." or ".." ("" = the root). Throws usage_error when ".." climbs above the root.
std::string normalize_store_path(std::string_view path);

// "1 version", "3 versions".
std::string plural(std::uint64_t n, std::string_view word);

// 1536 -> "1.5 KiB"; below 1 KiB "512 B".
std::string human_bytes(double bytes);
// logical / stored as "12.3x" ("-" when stored is 0).
std::string ratio_text(double logical, double stored);
// A fraction as a percentage with two significant digits: 0.0041 -> "0.41%", 0.31 -> "31%",
// 0 -> "0%"; "inf" when infinite.
std::string percent_text(double fraction);
// Unix seconds -> "2025-01-31 12:34:56" in local time ("-" for 0).
std::string time_text(double unix_seconds);

// Columns of text padded to their widest cell; columns named in `right` are right-aligned.
class text_table {
 public:
  explicit text_table(std::vector<std::string> header, std::vector<bool> right = {})
      : header_(std::move(header)), right_(std::move(right)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  bool empty() const { return rows_.empty(); }
  // Header and rows, each line prefixed by `indent`; the last column is never padded.
  std::string render(const std::string& indent = "  ") const;

 private:
  std::vector<std::string> header_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

// One /proc/self/mountinfo line's fields of interest.
struct mount_entry {
  std::string mount_point;  // unescaped
  std::string root;         // the mounted filesystem's directory shown here (bind mounts)
  std::string fstype;
  std::string source;  // unescaped
};
// Parses one mountinfo line (octal escapes \040 etc. undone); nullopt if malformed.
std::optional<mount_entry> parse_mountinfo_line(std::string_view line);
// The mount point of a mounted ckptfs whose store is `store_dir`, if there is one.
std::optional<std::string> find_ckptfs_mount(const std::string& store_dir);

// A one-line progress bar on stderr, drawn only when stderr is a terminal (a pipe or a log file
// gets nothing) and at most 10 times a second. Thread-safe (offline operations report from
// worker threads). clear() erases it before the command prints its result.
class progress_bar {
 public:
  progress_bar();  // enabled iff isatty(STDERR_FILENO)
  explicit progress_bar(bool enabled) : enabled_(enabled) {}
  ~progress_bar() { clear(); }
  progress_bar(const progress_bar&) = delete;
  progress_bar& operator=(const progress_bar&) = delete;

  void update(std::string_view phase, std::uint64_t done, std::uint64_t total);
  void clear();
  bool enabled() const { return enabled_; }

  // The text drawn for a report (without "\r"): "verify  [#####.....]  50%  1.2 GiB / 2.4 GiB".
  // Counts up to 100000 are shown as numbers, larger ones as sizes (phases report either
  // versions or bytes).
  static std::string render(std::string_view phase, std::uint64_t done, std::uint64_t total,
                            int width = 30);

 private:
  bool enabled_;
  std::mutex mu_;
  bool shown_ = false;
  std::string last_phase_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace ckpt::tools
