// `ckptctl prune [--keep-last N] [--keep-every M] [--keep-newer-than DURATION] [--dry-run]
// [--store STORE] [--json] PATH...`: keeps the versions a retention policy selects in each
// lineage under PATH and removes the others, like rm. The oldest kept version of a lineage, if it
// is a delta, is rewritten as a keyframe that reads exactly as before, so everything older is
// reclaimed.
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tools/commands.hpp"
#include "tools/ctl_store.hpp"

namespace ckpt::tools {
namespace {

struct prune_options {
  std::vector<std::string> paths;
  std::string store;
  std::optional<std::uint64_t> keep_last;
  std::optional<std::uint64_t> keep_every;
  std::optional<std::string> keep_newer_than;
  bool dry_run = false;
  bool json = false;
};

void print_text(const nlohmann::json& r) {
  const bool dry = jbool(r, "dry_run", false);
  const char* removed_word = dry ? "would remove" : "removed";
  for (const auto& l : jarr(r, "lineages")) {
    const auto& kept = jarr(l, "kept");
    const auto& removed = jarr(l, "removed");
    std::printf("lineage %llu: keeping %zu, %s %zu\n",
                static_cast<unsigned long long>(ju64(l, "lineage")), kept.size(), removed_word,
                removed.size());
    for (const auto& x : removed)
      std::printf("  %s %s (version %llu, %s stored)\n", removed_word, jstr(x, "path", "?").c_str(),
                  static_cast<unsigned long long>(ju64(x, "version")),
                  human_bytes(jnum(x, "stored_bytes")).c_str());
    for (const auto& x : kept)
      std::printf("  kept %s (version %llu)\n", jstr(x, "path", "?").c_str(),
                  static_cast<unsigned long long>(ju64(x, "version")));
  }
  const auto& rekeyed = jarr(r, "rekeyed");
  if (!rekeyed.empty()) {
    std::string s;
    for (const auto& v : rekeyed)
      s += (s.empty() ? "" : ", ") + std::to_string(v.get<std::uint64_t>());
    std::printf("%s as keyframes: version%s %s\n", dry ? "would rewrite" : "rewritten",
                rekeyed.size() > 1 ? "s" : "", s.c_str());
  }
  if (dry) {
    // Nothing is freed yet; what the removed versions store now is the most it can free (a
    // removed version that a kept delta still needs stays as a hidden base).
    std::set<std::uint64_t> seen;
    double bytes = 0;
    for (const auto& l : jarr(r, "lineages"))
      for (const auto& x : jarr(l, "removed"))
        if (seen.insert(ju64(x, "version")).second) bytes += jnum(x, "stored_bytes");
    std::printf("would remove %zu version(s) storing %s\n", seen.size(),
                human_bytes(bytes).c_str());
  } else {
    std::printf("freed %s\n", human_bytes(jnum(r, "freed_bytes")).c_str());
  }
}

// N >= min, digits only (CLI11's own range check accepts "-1" for unsigned options on some
// versions and prints its bounds as doubles).
CLI::Validator whole_number(unsigned min) {
  return CLI::Validator(
      [min](std::string& s) -> std::string {
        const bool digits =
            !s.empty() && s.size() <= 18 && s.find_first_not_of("0123456789") == std::string::npos;
        if (!digits || std::stoull(s) < min)
          return "must be a whole number >= " + std::to_string(min) + ", not '" + s + "'";
        return {};
      },
      min ? "N>=1" : "N>=0");
}

}  // namespace

void add_prune_command(CLI::App& app) {
  auto o = std::make_shared<prune_options>();
  auto* cmd = app.add_subcommand("prune", "Remove the versions a retention policy does not keep");
  cmd->footer(
      "A version is kept when any given rule keeps it (give at least one): --keep-last N "
      "keeps the newest N versions of each lineage, --keep-every M every M-th version "
      "counting from the oldest (the oldest included), --keep-newer-than D those completed "
      "less than D ago. The others lose their names, as with rm. If the oldest kept version "
      "of a lineage is a delta, it is rewritten as a keyframe that reads exactly as before, "
      "so the versions before it are reclaimed. No kept version's bytes change. Prints what "
      "was removed and the bytes freed.\n\n"
      "Examples:\n"
      "  ckptctl prune --keep-last 3 /mnt/ckpt/run1\n"
      "  ckptctl prune --keep-last 2 --keep-every 10 --dry-run /mnt/ckpt/run1/step_100.pt\n"
      "  ckptctl prune --keep-newer-than 2d --store /data/store run1     # offline\n");
  cmd->add_option("PATH", o->paths,
                  "Selects lineages: a file of a lineage, or a directory (every lineage with a "
                  "version under it), inside a ckptfs mount; a store directory (offline: every "
                  "lineage); or, with --store, a path in that store")
      ->required();
  cmd->add_option("--keep-last", o->keep_last,
                  "Keep the newest N versions of each lineage (N >= 1)")
      ->check(whole_number(1));
  cmd->add_option("--keep-every", o->keep_every,
                  "Keep every M-th version, counting from the oldest (M >= 1)")
      ->check(whole_number(1));
  cmd->add_option("--keep-newer-than", o->keep_newer_than,
                  "Keep versions completed less than DURATION ago: 30s, 15m, 2h, 7d, 1w, 1h30m");
  cmd->add_flag("--dry-run,-n", o->dry_run, "Show what would be removed; change nothing");
  cmd->add_option("--store", o->store,
                  "Work offline on this store directory (no daemon may hold it); PATHs are then "
                  "relative to the store's root, as the mount would show it");
  cmd->add_flag("--json", o->json, "Print the result as one JSON object (sizes in bytes)");
  cmd->callback([o] {
    if (!o->keep_last && !o->keep_every && !o->keep_newer_than)
      throw usage_error(
          "prune: give at least one rule: --keep-last N, --keep-every M or --keep-newer-than D");
    if (o->keep_every && *o->keep_every == 0) throw usage_error("prune: --keep-every must be >= 1");
    nlohmann::json req = {{"op", "prune"}, {"dry_run", o->dry_run}};
    if (o->keep_last) req["keep_last"] = *o->keep_last;
    if (o->keep_every) req["keep_every"] = *o->keep_every;
    // Whole seconds on the wire; a fraction rounds up (keeps a little more, never less).
    if (o->keep_newer_than)
      req["keep_newer_than"] = std::uint64_t(std::ceil(parse_duration(*o->keep_newer_than)));
    const auto targets = resolve_paths(o->paths, o->store, path_use::tree);
    nlohmann::json paths = nlohmann::json::array();
    for (const auto& t : targets) paths.push_back(t.rel);
    req["paths"] = paths;
    store_client client(targets.front().where);
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
