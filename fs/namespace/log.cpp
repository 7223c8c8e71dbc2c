#include "fs/namespace/log.hpp"

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <string>

namespace ckpt::fs {

void log_line(std::string_view level, std::string_view message) {
  timespec now{};
  timespec_get(&now, TIME_UTC);
  tm t{};
  gmtime_r(&now.tv_sec, &t);
  char stamp[40];
  std::size_t n = std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &t);
  std::string line(stamp, n);
  char ms[8];
  std::snprintf(ms, sizeof ms, ".%03ld", now.tv_nsec / 1000000);
  line += ms;
  line += "Z ckptfs[" + std::to_string(::getpid()) + "] ";
  line += level;
  line += ": ";
  line += message;
  line += '\n';
  [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace ckpt::fs
