#pragma once
// One log line per event, to stderr (a background daemon points stderr at STORE/ckptfs.log).
// Thread-safe: each line is one write(2).
#include <string_view>

namespace ckpt::fs {

void log_line(std::string_view level, std::string_view message);
inline void log_error(std::string_view m) {
  log_line("error", m);
}
inline void log_info(std::string_view m) {
  log_line("info", m);
}

}  // namespace ckpt::fs
