// `ckptctl stat FILE [--store STORE] [--json]`: how one file (one version) is stored: format,
// lineage, kind (exact / keyframe / delta) and base, sizes and ratio, completion time, the codec
// parameters it was coded with, and every tensor with its mode and stored size. Asked from the
// store's admin service (live through the daemon's control socket, or offline).
#include <cstdio>
#include <memory>
#include <string>

#include "tools/commands.hpp"
#include "tools/ctl_store.hpp"

namespace ckpt::tools {
namespace {

struct stat_options {
  std::string path;
  std::string store;
  bool json = false;
};

std::string scalar_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

// A tensor's or class's error as the daemon sent it: a fraction, infinite (an all-zero tensor
// stored with an error), or not recorded.
std::string error_text(const nlohmann::json& x) {
  if (jbool(x, "rel_error_inf", false)) return "inf";
  return x.contains("rel_error") ? percent_text(jnum(x, "rel_error")) : "-";
}

void print_text(const std::string& arg, const nlohmann::json& info) {
  const double logical = jnum(info, "logical_bytes"), stored = jnum(info, "stored_bytes");
  std::printf("file:     %s\n", arg.c_str());
  const auto& paths = jarr(info, "paths");
  if (paths.size() > 1) {
    std::string s;
    for (const auto& p : paths) s += (s.empty() ? "" : ", ") + p.get<std::string>();
    std::printf("names:    %s\n", s.c_str());
  }
  std::printf("format:   %s\n", jstr(info, "format", "?").c_str());
  const std::string kind = jstr(info, "kind", "?");
  if (kind == "delta")
    std::printf("kind:     delta (base version %llu)\n",
                static_cast<unsigned long long>(ju64(info, "base")));
  else
    std::printf("kind:     %s\n", kind.c_str());
  if (ju64(info, "lineage"))
    std::printf("lineage:  %llu\n", static_cast<unsigned long long>(ju64(info, "lineage")));
  std::printf("version:  %llu\n", static_cast<unsigned long long>(ju64(info, "version")));
  std::printf("created:  %s\n", time_text(jnum(info, "created")).c_str());
  std::printf("logical:  %s\n", human_bytes(logical).c_str());
  if (info.contains("exact_stored_bytes") && kind != "exact")
    std::printf("stored:   %s (exact parts %s)\n", human_bytes(stored).c_str(),
                human_bytes(jnum(info, "exact_stored_bytes")).c_str());
  else
    std::printf("stored:   %s\n", human_bytes(stored).c_str());
  const double head = jnum(info, "head_bytes");
  if (head > 0)
    std::printf("head:     %s (image of this lineage's newest version, in the scratch directory)\n",
                human_bytes(head).c_str());
  if (stored + head > 0) std::printf("ratio:    %s\n", ratio_text(logical, stored + head).c_str());
  // Exact files are not coded: no codec parameters to show.
  if (auto c = info.find("coding");
      kind != "exact" && c != info.end() && c->is_object() && !c->empty()) {
    if ((kind == "keyframe" || jnum(*c, "bits") == 0) && jnum(*c, "keyframe_bits") > 0) {
      std::printf("coding:   keyframe, float tensors rounded to %d mantissa bits or fewer\n",
                  int(jnum(*c, "keyframe_bits")));
    } else if (kind == "keyframe" || jnum(*c, "bits") == 0) {
      std::printf("coding:   lossless (keyframe)\n");
    } else {
      std::string s;
      for (const auto& [k, v] : c->items()) {
        // As -o takes them: weight_error is a fraction in the JSON and a percentage in -o
        // weight_error, grid_error a factor ("4", not "4.0").
        std::string text = scalar_text(v);
        if (k == "weight_error" && v.is_number()) text = percent_text(v.get<double>());
        if (k == "grid_error" && v.is_number()) {
          char buf[32];
          std::snprintf(buf, sizeof buf, "%g", v.get<double>());
          text = buf;
        }
        s += (s.empty() ? "" : " ") + k + "=" + text;
      }
      std::printf("coding:   %s\n", s.c_str());
    }
  }
  // Relative L2 error of each class of lossy tensors against what was written.
  const auto& fidelity = jarr(info, "fidelity");
  if (!fidelity.empty()) {
    std::string s;
    for (const auto& c : fidelity)
      s += (s.empty() ? "" : ", ") + jstr(c, "class", "?") + " " + error_text(c) + " (" +
           std::to_string(ju64(c, "tensors")) + ")";
    std::printf("error:    %s\n", s.c_str());
    std::printf(
        "          (relative L2 error of the stored tensors against what was written,\n"
        "          per class, number of lossy tensors in brackets)\n");
  }
  const auto& tensors = jarr(info, "tensors");
  if (!tensors.empty()) {
    std::printf("tensors:  %zu\n", tensors.size());
    text_table t({"NAME", "DTYPE", "ELEMENTS", "MODE", "STORED", "ERROR"},
                 {false, false, true, false, true, true});
    for (const auto& x : tensors) {
      // A DCP shard's tensor: its position, then its name in the state dict when known.
      std::string name = jstr(x, "name", "?");
      if (const std::string q = jstr(x, "state_name", ""); !q.empty()) name += " = " + q;
      t.add({name, jstr(x, "dtype", "?"), std::to_string(ju64(x, "elements")), jstr(x, "mode", "?"),
             human_bytes(jnum(x, "stored_bytes")), error_text(x)});
    }
    std::fputs(t.render().c_str(), stdout);
  }
}

}  // namespace

void add_stat_command(CLI::App& app) {
  auto o = std::make_shared<stat_options>();
  auto* cmd = app.add_subcommand("stat", "Show how one file is stored.");
  cmd->footer(
      "Format, lineage, kind (exact / keyframe / delta) and base version, logical and "
      "stored size, the head image (a lineage's newest version may have one: its full size "
      "on disk) and the ratio (logical / (stored + head)), completion time, the codec "
      "parameters it was coded with (bits, group, representative, bucket scope, coder, exact "
      "optimizer state, relative, and where set grid, refresh_bits, ratio_bits, keyframe_bits, "
      "weight_error, grid_error: docs/management.md), the error per class of tensors (weights, "
      "exp_avg, "
      "exp_avg_sq, other optimizer state: the relative L2 error sqrt(sum (stored - written)^2 / "
      "sum written^2) of the version against the bytes that were written, measured when it was "
      "coded; a delta's error is its own, not accumulated along the chain, since each delta is "
      "coded against its base's reconstruction) and every tensor with its dtype, element count, "
      "mode (delta, grid, ratio, intra, ratio+intra, grid+intra, rounded or lossless), stored size "
      "and error ('-': not recorded, versions "
      "stored before ckptfs measured it).\n");
  cmd->add_option("FILE", o->path, "A file inside a ckptfs mount (or, with --store, in a store)")
      ->required();
  cmd->add_option("--store", o->store,
                  "Work offline on this store directory (no daemon may hold it); FILE is then "
                  "relative to the store's root, as the mount would show it");
  cmd->add_flag("--json", o->json, "Print the result as one JSON object (sizes in bytes)");
  cmd->callback([o] {
    const target_path t = resolve_path(o->path, o->store, path_use::file);
    store_client client(t.where);
    progress_bar bar;
    nlohmann::json info = client.call({{"op", "stat"}, {"path", t.rel}}, bar);
    // On disk: the object and, for a lineage's newest version, its head image.
    const double logical = jnum(info, "logical_bytes"),
                 disk = jnum(info, "stored_bytes") + jnum(info, "head_bytes");
    info["ratio"] = disk > 0 ? logical / disk : 0.0;
    if (o->json)
      print_json(info);
    else
      print_text(o->path, info);
    exit_status = 0;
  });
}

}  // namespace ckpt::tools
