// `ckptctl stat FILE`: how one file inside a ckptfs mount is stored. The daemon answers the
// virtual extended attribute "user.ckptfs.info" (never listed by listxattr) with a JSON object;
// this command formats it.
#include <sys/xattr.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "codec/error.hpp"
#include "tools/commands.hpp"

namespace ckpt::tools {
namespace {

constexpr const char* kInfoXattr = "user.ckptfs.info";

std::string human(double bytes) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
  return buf;
}

nlohmann::json read_info(const std::string& path) {
  std::vector<char> buf(4096);
  for (;;) {
    const ssize_t n = ::getxattr(path.c_str(), kInfoXattr, buf.data(), buf.size());
    if (n >= 0) return nlohmann::json::parse(buf.begin(), buf.begin() + n);
    if (errno == ERANGE) {
      buf.resize(buf.size() * 4);
      continue;
    }
    if (errno == ENODATA || errno == ENOTSUP)
      throw error(errc::invalid, path + ": not a file inside a ckptfs mount");
    throw io_error(errno, path + ": " + std::strerror(errno));
  }
}

}  // namespace

void add_stat_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("stat", "How one file inside a ckptfs mount is stored");
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("FILE", *path, "A file inside a mounted ckptfs")->required();
  cmd->add_flag("--json", *json, "Print one JSON object");
  cmd->callback([path, json] {
    auto info = read_info(*path);
    const double logical = info.value("logical_bytes", 0.0), stored = info.value("stored_bytes", 0.0);
    info["ratio"] = stored > 0 ? logical / stored : 0.0;
    if (*json) {
      std::cout << info.dump() << "\n";
      return;
    }
    std::printf("file:     %s\n", path->c_str());
    std::printf("format:   %s\n", info.value("format", "?").c_str());
    const std::string kind = info.value("kind", "?");
    if (kind == "delta")
      std::printf("kind:     delta (base version %llu)\n",
                  static_cast<unsigned long long>(info.value("base", 0ull)));
    else
      std::printf("kind:     %s\n", kind.c_str());
    if (info.value("lineage", 0ull))
      std::printf("lineage:  %llu\n", static_cast<unsigned long long>(info.value("lineage", 0ull)));
    std::printf("version:  %llu\n", static_cast<unsigned long long>(info.value("version", 0ull)));
    std::printf("logical:  %s\n", human(logical).c_str());
    std::printf("stored:   %s\n", human(stored).c_str());
    if (stored > 0) std::printf("ratio:    %.1fx\n", logical / stored);
  });
}

}  // namespace ckpt::tools
