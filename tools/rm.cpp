// `ckptctl rm FILE... [--store STORE] [--json]`: removes files (versions) from the namespace,
// exactly like `rm` through the mount, and usable offline. A removed version's space is
// reclaimed once no remaining version depends on it; what every other version reads is never
// changed. Exit status 1 if any FILE could not be removed (the others still are).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tools/commands.hpp"
#include "tools/ctl_store.hpp"

namespace ckpt::tools {
namespace {

struct rm_options {
  std::vector<std::string> paths;
  std::string store;
  bool json = false;
};

}  // namespace

void add_rm_command(CLI::App& app) {
  auto o = std::make_shared<rm_options>();
  auto* cmd = app.add_subcommand(
      "rm", "Remove files (checkpoint versions), like rm through the mount, also offline.");
  cmd->footer(
      "The space of a removed version is reclaimed once no remaining version depends on it "
      "(a delta's base stays as a hidden base until then); every other version keeps "
      "reading exactly the same bytes. Prints what was removed and the bytes freed.\n");
  cmd->add_option("FILE", o->paths,
                  "Files inside a ckptfs mount (or, with --store, paths in a store)")
      ->required();
  cmd->add_option("--store", o->store,
                  "Work offline on this store directory (no daemon may hold it); FILEs are then "
                  "relative to the store's root, as the mount would show it");
  cmd->add_flag("--json", o->json, "Print the result as one JSON object (sizes in bytes)");
  cmd->callback([o] {
    const auto targets = resolve_paths(o->paths, o->store, path_use::remove);
    nlohmann::json paths = nlohmann::json::array();
    for (const auto& t : targets) paths.push_back(t.rel);
    store_client client(targets.front().where);
    progress_bar bar;
    const nlohmann::json r = client.call({{"op", "rm"}, {"paths", paths}}, bar);
    const auto& errors = jarr(r, "errors");
    exit_status = errors.empty() ? 0 : 1;
    if (o->json) {
      print_json(r);
      return;
    }
    for (const auto& x : jarr(r, "removed"))
      std::printf("removed %s (version %llu, %s stored)\n", jstr(x, "path", "?").c_str(),
                  static_cast<unsigned long long>(ju64(x, "version")),
                  human_bytes(jnum(x, "stored_bytes")).c_str());
    for (const auto& x : errors)
      std::fprintf(stderr, "ckptctl: rm: %s: %s\n", jstr(x, "path", "?").c_str(),
                   jstr(x, "error", "failed").c_str());
    std::printf("freed %s\n", human_bytes(jnum(r, "freed_bytes")).c_str());
  });
}

}  // namespace ckpt::tools
