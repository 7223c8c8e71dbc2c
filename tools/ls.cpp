// `ckptctl ls [PATH] [--store STORE] [--json]`: the lineages (checkpoint histories) with a version
// at or under PATH and each of their versions: paths, completion time, kind (keyframe / delta /
// exact), base, logical and stored size, head image size, ratio; totals per lineage and for the
// store. Ratios are logical / (stored + head images): a head image costs its full size on disk.
#include <iostream>
#include <map>
#include <memory>
#include <set>
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
  if (!jbool(v, "live", true))
    return jstr(v, "kind", "") == "exact" ? "(hidden donor: blocks reused by newer versions)"
                                          : "(hidden base)";
  std::string s;
  for (const auto& p : jarr(v, "paths")) {
    if (!s.empty()) s += ", ";
    s += p.get<std::string>();
  }
  return s.empty() ? "-" : s;
}

// "stored 3.5 MiB" or, when head images count, "stored 3.5 MiB + head 3.0 MiB".
std::string stored_text(double stored, double head, const char* head_word) {
  std::string s = "stored " + human_bytes(stored);
  if (head > 0) s += std::string(" + ") + head_word + " " + human_bytes(head);
  return s;
}

// Every ratio counts what is on disk: the objects and the head images (a head costs the
// checkpoint's full size).
void add_version_row(text_table& t, const nlohmann::json& v) {
  const double logical = jnum(v, "logical_bytes"), stored = jnum(v, "stored_bytes"),
               head = jnum(v, "head_bytes");
  const std::uint64_t base = ju64(v, "base");
  t.add({std::to_string(ju64(v, "version")), time_text(jnum(v, "created")), jstr(v, "kind", "?"),
         base ? std::to_string(base) : "-", human_bytes(logical), human_bytes(stored),
         head > 0 ? human_bytes(head) : "-", ratio_text(logical, stored + head), paths_text(v)});
}

text_table version_table() {
  return text_table(
      {"VERSION", "CREATED", "KIND", "BASE", "LOGICAL", "STORED", "HEAD", "RATIO", "PATH"},
      {true, false, false, true, true, true, true, true, false});
}

// Sharded saves (DCP's step_N/__R_F.distcp, DeepSpeed's global_stepN/, sharded safetensors):
// one line per directory holding live versions of two or more lineages, what the step costs.
void print_steps(const nlohmann::json& r) {
  struct step {
    std::set<std::uint64_t> lineages;
    std::size_t files = 0;
    double logical = 0, stored = 0, head = 0;
  };
  std::map<std::string, step> steps;
  for (const auto& l : jarr(r, "lineages"))
    for (const auto& v : jarr(l, "versions"))
      for (const auto& p : jarr(v, "paths")) {
        const std::string path = p.get<std::string>();
        const auto slash = path.rfind('/');
        step& s = steps[slash == std::string::npos ? "." : path.substr(0, slash)];
        s.lineages.insert(ju64(l, "lineage"));
        ++s.files;
        s.logical += jnum(v, "logical_bytes");
        s.stored += jnum(v, "stored_bytes");
        s.head += jnum(v, "head_bytes");
      }
  std::erase_if(steps, [](const auto& e) { return e.second.lineages.size() < 2; });
  if (steps.empty()) return;
  std::printf("sharded saves (directories with files of several lineages): %zu\n", steps.size());
  text_table t({"DIRECTORY", "FILES", "LOGICAL", "STORED", "HEAD", "RATIO"},
               {false, true, true, true, true, true});
  for (const auto& [dir, s] : steps)
    t.add({dir, std::to_string(s.files), human_bytes(s.logical), human_bytes(s.stored),
           s.head > 0 ? human_bytes(s.head) : "-", ratio_text(s.logical, s.stored + s.head)});
  std::fputs(t.render().c_str(), stdout);
  std::printf("\n");
}

void print_text(const nlohmann::json& r) {
  for (const auto& l : jarr(r, "lineages")) {
    const auto& versions = jarr(l, "versions");
    const double logical = jnum(l, "logical_bytes"), stored = jnum(l, "stored_bytes"),
                 head = jnum(l, "head_bytes");
    const std::string format = versions.empty() ? "?" : jstr(versions.front(), "format", "?");
    std::printf("lineage %llu (%s): %s, %llu live; logical %s, %s, %s\n",
                static_cast<unsigned long long>(ju64(l, "lineage")), format.c_str(),
                plural(versions.size(), "version").c_str(),
                static_cast<unsigned long long>(ju64(l, "live_versions")),
                human_bytes(logical).c_str(), stored_text(stored, head, "head").c_str(),
                ratio_text(logical, stored + head).c_str());
    text_table t = version_table();
    for (const auto& v : versions) add_version_row(t, v);
    std::fputs(t.render().c_str(), stdout);
    std::printf("\n");
  }
  print_steps(r);
  const auto& files = jarr(r, "files");
  if (!files.empty()) {
    double logical = 0, stored = 0;
    std::size_t live = 0;
    for (const auto& v : files) {
      const bool is_live = jbool(v, "live", true);
      live += is_live;
      if (is_live) logical += jnum(v, "logical_bytes");  // what reads back
      stored += jnum(v, "stored_bytes");                 // what is on disk, donors included
    }
    std::printf("exact files: %zu; logical %s, stored %s, %s\n", live, human_bytes(logical).c_str(),
                human_bytes(stored).c_str(), ratio_text(logical, stored).c_str());
    text_table t = version_table();
    for (const auto& v : files) add_version_row(t, v);
    std::fputs(t.render().c_str(), stdout);
    std::printf("\n");
  }
  // The totals always name the head images, also when there are none: the ratio is on disk.
  const nlohmann::json tot = r.contains("totals") ? r.at("totals") : nlohmann::json::object();
  const double logical = jnum(tot, "logical_bytes"), stored = jnum(tot, "stored_bytes"),
               head = jnum(tot, "head_bytes");
  std::printf("total: %s, %llu live; logical %s, stored %s + heads %s = %s on disk, %s\n",
              plural(ju64(tot, "versions"), "version").c_str(),
              static_cast<unsigned long long>(ju64(tot, "live_versions")),
              human_bytes(logical).c_str(), human_bytes(stored).c_str(), human_bytes(head).c_str(),
              human_bytes(stored + head).c_str(), ratio_text(logical, stored + head).c_str());
}

}  // namespace

void add_ls_command(CLI::App& app) {
  auto o = std::make_shared<ls_options>();
  auto* cmd = app.add_subcommand("ls", "List checkpoint lineages and their versions.");
  cmd->footer(
      "For each lineage with a version at or under PATH: every version (oldest first, "
      "hidden bases included) with its paths, completion time, kind (keyframe / delta / "
      "exact), base version, logical and stored size, head image size and ratio, then totals "
      "per lineage and for the store. A lineage's newest version may have a head image: a "
      "full-size copy of what it reads as, kept in the scratch directory so that restores and "
      "the next delta do not replay the chain; it costs its full size on disk, and every ratio "
      "shown (logical / (stored + heads)) counts it. Exact (non-checkpoint) files under PATH "
      "are listed after the lineages, with the hidden versions whose blocks they reuse after a "
      "partial rewrite (donors, counted in the stored bytes). Sharded saves (a directory with "
      "files of several lineages: DCP's step_N/__R_F.distcp, DeepSpeed's global_stepN/, "
      "sharded safetensors) get one line each: files, sizes and ratio of the step.\n");
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
