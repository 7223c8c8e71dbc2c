// `ckptctl ls [PATH] [--store STORE] [--json]`: the lineages (checkpoint histories) with a version
// at or under PATH and each of their versions: paths, completion time, kind (keyframe / delta /
// exact), base, logical and stored size, ratio; totals per lineage and for the store.
#include <iostream>
#include <memory>
#include <string>

#include "tools/commands.hpp"
#include "tools/ctl_store.hpp"

namespace ckpt::tools {
namespace {

struct ls_options {
  std::string path;
  std::string store;
  bool json = false;
};

std::string paths_text(const nlohmann::json& v) {
  if (!v.value("live", true)) return "(hidden base)";
  std::string s;
  for (const auto& p : v.value("paths", nlohmann::json::array())) {
    if (!s.empty()) s += ", ";
    s += p.get<std::string>();
  }
  return s.empty() ? "-" : s;
}

void add_version_row(text_table& t, const nlohmann::json& v) {
  const double logical = v.value("logical_bytes", 0.0), stored = v.value("stored_bytes", 0.0);
  const std::uint64_t base = v.value("base", std::uint64_t(0));
  t.add({std::to_string(v.value("version", std::uint64_t(0))), time_text(v.value("created", 0.0)),
         v.value("kind", "?"), base ? std::to_string(base) : "-", human_bytes(logical),
         human_bytes(stored), ratio_text(logical, stored), paths_text(v)});
}

text_table version_table() {
  return text_table({"VERSION", "CREATED", "KIND", "BASE", "LOGICAL", "STORED", "RATIO", "PATH"},
                    {true, false, false, true, true, true, true, false});
}

void print_text(const nlohmann::json& r) {
  for (const auto& l : r.value("lineages", nlohmann::json::array())) {
    const auto& versions = l.value("versions", nlohmann::json::array());
    const double logical = l.value("logical_bytes", 0.0), stored = l.value("stored_bytes", 0.0);
    const std::string format = versions.empty() ? "?" : versions.front().value("format", "?");
    std::printf("lineage %llu (%s): %zu versions, %llu live; logical %s, stored %s, %s\n",
                static_cast<unsigned long long>(l.value("lineage", std::uint64_t(0))),
                format.c_str(), versions.size(),
                static_cast<unsigned long long>(l.value("live_versions", std::uint64_t(0))),
                human_bytes(logical).c_str(), human_bytes(stored).c_str(),
                ratio_text(logical, stored).c_str());
    text_table t = version_table();
    for (const auto& v : versions) add_version_row(t, v);
    std::fputs(t.render().c_str(), stdout);
    std::printf("\n");
  }
  const auto& files = r.value("files", nlohmann::json::array());
  if (!files.empty()) {
    double logical = 0, stored = 0;
    for (const auto& v : files) {
      logical += v.value("logical_bytes", 0.0);
      stored += v.value("stored_bytes", 0.0);
    }
    std::printf("exact files: %zu; logical %s, stored %s, %s\n", files.size(),
                human_bytes(logical).c_str(), human_bytes(stored).c_str(),
                ratio_text(logical, stored).c_str());
    text_table t = version_table();
    for (const auto& v : files) add_version_row(t, v);
    std::fputs(t.render().c_str(), stdout);
    std::printf("\n");
  }
  const auto& tot = r.value("totals", nlohmann::json::object());
  const double logical = tot.value("logical_bytes", 0.0), stored = tot.value("stored_bytes", 0.0);
  std::printf("total: %llu versions, %llu live; logical %s, stored %s, %s\n",
              static_cast<unsigned long long>(tot.value("versions", std::uint64_t(0))),
              static_cast<unsigned long long>(tot.value("live_versions", std::uint64_t(0))),
              human_bytes(logical).c_str(), human_bytes(stored).c_str(),
              ratio_text(logical, stored).c_str());
}

}  // namespace

void add_ls_command(CLI::App& app) {
  auto o = std::make_shared<ls_options>();
  auto* cmd = app.add_subcommand("ls", "List checkpoint lineages and their versions.");
  cmd->footer(
      "For each lineage with a version at or under PATH: every version (oldest first, "
      "hidden bases included) with its paths, completion time, kind (keyframe / delta / "
      "exact), base version, logical and stored size and ratio, then totals per lineage and "
      "for the store. Exact (non-checkpoint) files under PATH are listed after the "
      "lineages.\n");
  cmd->add_option("PATH", o->path,
                  "A file or directory inside a ckptfs mount (default: the current directory), "
                  "or a store directory (offline: the whole store)");
  cmd->add_option("--store", o->store,
                  "Work offline on this store directory (no daemon may hold it); PATH is then "
                  "relative to the store's root, as the mount would show it");
  cmd->add_flag("--json", o->json, "Print the result as one JSON object (sizes in bytes)");
  cmd->callback([o] {
    const std::string arg = !o->path.empty() ? o->path : (o->store.empty() ? "." : "");
    const target_path t = resolve_path(arg, o->store, path_use::tree);
    nlohmann::json req = {{"op", "ls"}};
    if (!t.rel.empty()) req["path"] = t.rel;
    store_client client(t.where);
    progress_bar bar;
    const nlohmann::json r = client.call(req, bar);
    if (o->json)
      print_json(r);
    else
      print_text(r);
    exit_status = 0;
  });
}

}  // namespace ckpt::tools
