// `ckptctl verify [--deep] [--json] STORE|MOUNTPOINT`: checks every object's checksums and every
// reference the journal makes (each version's object, each delta's base); --deep also decodes
// every version and compares it with the digest recorded when it was stored. Names each damaged
// file. Exit status 0 clean, 1 damage found (or the check itself failed).
#include <cstdio>
#include <memory>
#include <string>

#include "tools/commands.hpp"
#include "tools/ctl_store.hpp"

namespace ckpt::tools {
namespace {

struct verify_options {
  std::string target;
  bool deep = false;
  bool json = false;
};

}  // namespace

void add_verify_command(CLI::App& app) {
  auto o = std::make_shared<verify_options>();
  auto* cmd = app.add_subcommand("verify", "Check the store: every checksum and every reference.");
  cmd->footer(
      "Reads every object and checks its checksums, and checks that every version's object "
      "and every delta's base exist; --deep also decodes every version and compares it with "
      "the digest recorded when it was stored. Each damaged file is reported by path (a "
      "damaged base makes every version that depends on it damaged). Objects nothing needs "
      "are counted (`ckptctl gc` removes them); they are not damage. Exit status 1 if "
      "anything is damaged.\n");
  cmd->add_option("STORE|MOUNTPOINT", o->target,
                  "A store directory (offline; no daemon may hold it) or a ckptfs mount point "
                  "(or any path inside the mount)")
      ->required();
  cmd->add_flag("--deep", o->deep, "Also decode every version and check its recorded digest");
  cmd->add_flag("--json", o->json, "Print the result as one JSON object");
  cmd->callback([o] {
    const target_path t = resolve_path(o->target, "", path_use::store);
    store_client client(t.where);
    progress_bar bar;
    const nlohmann::json r = client.call({{"op", "verify"}, {"deep", o->deep}}, bar);
    const bool ok = jbool(r, "ok", false);
    exit_status = ok ? 0 : 1;
    if (o->json) {
      print_json(r);
      return;
    }
    const auto& damaged = jarr(r, "damaged");
    for (const auto& d : damaged)
      std::printf("DAMAGED %s (version %llu): %s\n", jstr(d, "path", "(no name)").c_str(),
                  static_cast<unsigned long long>(ju64(d, "version")),
                  jstr(d, "problem", "?").c_str());
    std::printf("%s: %s, %s, %s checked%s\n", ok ? "ok" : "DAMAGE FOUND",
                plural(ju64(r, "versions"), "version").c_str(),
                plural(ju64(r, "objects"), "object").c_str(), human_bytes(jnum(r, "bytes")).c_str(),
                o->deep ? " (deep)" : "");
    if (!damaged.empty()) std::printf("%s damaged\n", plural(damaged.size(), "name").c_str());
    if (const auto n = ju64(r, "unreferenced_objects"))
      std::printf("%s nothing refers to: not damage; `ckptctl gc` reclaims them\n",
                  plural(n, "object").c_str());
  });
}

}  // namespace ckpt::tools
