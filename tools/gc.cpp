// `ckptctl gc [--dry-run] [--json] STORE|MOUNTPOINT`: removes objects no version needs (left by
// a crash, or hidden bases nothing depends on any more) and reports the space freed.
#include <cstdio>
#include <memory>
#include <string>

#include "tools/commands.hpp"
#include "tools/ctl_store.hpp"

namespace ckpt::tools {
namespace {

struct gc_options {
  std::string target;
  bool dry_run = false;
  bool json = false;
};

}  // namespace

void add_gc_command(CLI::App& app) {
  auto o = std::make_shared<gc_options>();
  auto* cmd = app.add_subcommand("gc", "Reclaim objects no version needs.");
  cmd->footer(
      "Removes objects that no file and no kept base depends on: leftovers of a crash, and "
      "hidden bases whose last dependent version is gone. Never touches what any file "
      "reads.\n");
  cmd->add_option("STORE|MOUNTPOINT", o->target,
                  "A store directory (offline; no daemon may hold it) or a ckptfs mount point "
                  "(or any path inside the mount)")
      ->required();
  cmd->add_flag("--dry-run,-n", o->dry_run, "Only count what would be removed");
  cmd->add_flag("--json", o->json, "Print the result as one JSON object (sizes in bytes)");
  cmd->callback([o] {
    const target_path t = resolve_path(o->target, "", path_use::store);
    store_client client(t.where);
    progress_bar bar;
    const nlohmann::json r = client.call({{"op", "gc"}, {"dry_run", o->dry_run}}, bar);
    exit_status = 0;
    if (o->json) {
      print_json(r);
      return;
    }
    std::printf("%s %s, %s %s\n", o->dry_run ? "would remove" : "removed",
                plural(ju64(r, "removed_objects"), "object").c_str(),
                o->dry_run ? "would free" : "freed", human_bytes(jnum(r, "freed_bytes")).c_str());
  });
}

}  // namespace ckpt::tools
