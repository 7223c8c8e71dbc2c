// `ckptctl status [--json] MOUNT|STORE`: what the running daemon holds right now (issue 13,
// DESIGN.md §12): its memory budget (cache= + buffer= + 512 MiB) against its resident memory and
// peak, the cache, write buffers in memory and spilled to staging files, commits queued and
// running, encode slots, head images and the scratch directory. Asked over the control socket;
// a store no daemon serves holds nothing, which is said and is exit status 1.
#include <cerrno>
#include <cstdio>
#include <memory>
#include <string>

#include "codec/error.hpp"
#include "fs/admin/control_protocol.hpp"
#include "tools/commands.hpp"
#include "tools/ctl_store.hpp"

namespace ckpt::tools {
namespace {

struct status_options {
  std::string target;
  bool json = false;
};

std::string of_text(double part, double whole) {
  return human_bytes(part) + " of " + human_bytes(whole);
}

void print_text(const nlohmann::json& r) {
  const auto& budget = r.contains("budget") ? r["budget"] : nlohmann::json::object();
  const auto& proc = r.contains("process") ? r["process"] : nlohmann::json::object();
  const auto& cache = r.contains("cache") ? r["cache"] : nlohmann::json::object();
  const auto& buf = r.contains("buffers") ? r["buffers"] : nlohmann::json::object();
  const auto& commits = r.contains("commits") ? r["commits"] : nlohmann::json::object();
  const auto& rotation = r.contains("rotation") ? r["rotation"] : nlohmann::json::object();
  const auto& enc = r.contains("encodes") ? r["encodes"] : nlohmann::json::object();
  const auto& heads = r.contains("heads") ? r["heads"] : nlohmann::json::object();
  const auto& scratch = r.contains("scratch") ? r["scratch"] : nlohmann::json::object();

  std::printf("daemon:   pid %llu, store %s, mounted at %s\n",
              static_cast<unsigned long long>(ju64(r, "pid")), jstr(r, "store").c_str(),
              jstr(r, "mountpoint").c_str());
  const double bound = jnum(budget, "bound_bytes");
  std::printf("memory:   resident %s, peak %s; bound %s = cache %s + buffer %s + %s%s\n",
              human_bytes(jnum(proc, "rss_bytes")).c_str(),
              human_bytes(jnum(proc, "peak_rss_bytes")).c_str(), human_bytes(bound).c_str(),
              human_bytes(jnum(budget, "cache_bytes")).c_str(),
              human_bytes(jnum(budget, "buffer_bytes")).c_str(),
              human_bytes(jnum(budget, "overhead_bytes")).c_str(),
              jbool(proc, "peak_within_bound", true) ? "" : " (the peak is ABOVE the bound)");
  std::printf("cache:    %s; decoded chunks %s\n",
              of_text(jnum(cache, "bytes"), jnum(cache, "budget_bytes")).c_str(),
              of_text(jnum(cache, "chunk_bytes"), jnum(cache, "chunk_budget_bytes")).c_str());
  if (const std::uint64_t in_place = ju64(cache, "in_place_bytes"))
    std::printf("          %s of reconstructions made over their bases' buffers since the mount\n",
                human_bytes(double(in_place)).c_str());
  std::printf("buffers:  %s in memory, %s spilled to staging files, %s of freed chunks kept\n",
              of_text(jnum(buf, "memory_bytes"), jnum(buf, "budget_bytes")).c_str(),
              human_bytes(jnum(buf, "spilled_bytes")).c_str(),
              human_bytes(jnum(buf, "pooled_bytes")).c_str());
  std::printf("commits:  %llu running, %llu queued\n",
              static_cast<unsigned long long>(ju64(commits, "running")),
              static_cast<unsigned long long>(ju64(commits, "queued")));
  std::printf("rotation: %s rewritten as keyframes (%s written), %s of hidden versions freed%s\n",
              plural(ju64(rotation, "rewrites"), "version").c_str(),
              human_bytes(jnum(rotation, "written_bytes")).c_str(),
              human_bytes(jnum(rotation, "freed_bytes")).c_str(),
              jbool(rotation, "pending", false) ? "; deletions and closes being looked at" : "");
  std::printf("encodes:  %llu of %llu slots in use, %s allocated by the slots\n",
              static_cast<unsigned long long>(ju64(enc, "in_use")),
              static_cast<unsigned long long>(ju64(enc, "slots")),
              human_bytes(jnum(enc, "memory_bytes")).c_str());
  if (r.contains("codec")) {
    const auto& codec = r["codec"];
    std::printf("codec:    %s of per-thread scratch in %s\n",
                human_bytes(jnum(codec, "scratch_bytes")).c_str(),
                plural(ju64(codec, "scratch_threads"), "thread").c_str());
  }
  // Many cores: the encode sets and the codec's scratch beyond their share of the allowance
  // shrink the cache (fs/content/thread_limits.hpp).
  if (jnum(cache, "lent_to_coding_bytes") > 0)
    std::printf(
        "          %s of cache= given to encodes and codec scratch beyond their allowance\n",
        human_bytes(jnum(cache, "lent_to_coding_bytes")).c_str());
  // The pools are charged for what they hold, some of it not touched yet (an idle daemon's
  // encode slots): then the process holds nothing measurable besides them.
  if (proc.contains("uncounted_bytes") && ju64(proc, "uncounted_bytes") == 0)
    std::printf("other:    nothing measurable besides the above (they count pages not used yet)\n");
  else if (proc.contains("uncounted_bytes"))
    std::printf(
        "other:    %s resident besides the above (code, threads, I/O buffers, the\n"
        "          allocator), of the %s the bound allows for it\n",
        human_bytes(jnum(proc, "uncounted_bytes")).c_str(),
        human_bytes(jnum(budget, "overhead_bytes")).c_str());
  if (r.contains("reads")) {
    const auto& rd = r["reads"];
    std::printf(
        "reads:    %s (%s) decoded for cold reads, %llu of them (%s) decoded before\n"
        "          (evicted before their readers were done, or read again); %s (%s) for\n"
        "          the kernel's reads away from the reader; %s through base chains\n",
        plural(ju64(rd, "chunks_decoded"), "chunk").c_str(),
        human_bytes(jnum(rd, "decoded_bytes")).c_str(),
        static_cast<unsigned long long>(ju64(rd, "chunks_decoded_again")),
        human_bytes(jnum(rd, "decoded_again_bytes")).c_str(),
        plural(ju64(rd, "stray_blocks_decoded"), "block").c_str(),
        human_bytes(jnum(rd, "stray_bytes")).c_str(),
        plural(ju64(rd, "frames_decoded"), "frame").c_str());
  }
  if (r.contains("streams")) {
    const auto& st = r["streams"];
    std::printf(
        "streams:  %llu running; %s stored while written (streams coded %s of tensors),\n"
        "          %llu redone after the file changed or was not what the stream read\n",
        static_cast<unsigned long long>(ju64(st, "running")),
        plural(ju64(st, "used"), "file").c_str(), human_bytes(jnum(st, "coded_bytes")).c_str(),
        static_cast<unsigned long long>(ju64(st, "dropped")));
    if (const std::uint64_t declined = ju64(st, "declined"))
      std::printf("          %s left to the commit by its stream (the last: %s)\n",
                  plural(declined, "file").c_str(), jstr(st, "last_declined").c_str());
    if (const std::uint64_t kept = ju64(st, "kept_bytes"))
      std::printf("          %s of reconstructions kept in the cache as the next saves' bases\n",
                  human_bytes(double(kept)).c_str());
    if (const std::uint64_t not_kept = ju64(st, "not_kept"))
      std::printf(
          "          %s without an image not kept whole in the cache: their bases had left it\n"
          "          while other saves ran, and it had no room beside theirs (cache= holds\n"
          "          fewer than the lineages saving)\n",
          plural(not_kept, "save").c_str());
  }
  if (jbool(heads, "enabled"))
    std::printf("heads:    %s (%llu published), %s in memory, %s on disk (head_min %s)\n",
                plural(ju64(heads, "images"), "image").c_str(),
                static_cast<unsigned long long>(ju64(heads, "published")),
                human_bytes(jnum(heads, "memory_bytes")).c_str(),
                human_bytes(jnum(heads, "disk_bytes")).c_str(),
                human_bytes(jnum(heads, "min_bytes")).c_str());
  if (jbool(heads, "enabled") && (ju64(heads, "retirements") || ju64(heads, "retire_refused")))
    std::printf(
        "          %llu saves freed their base's image behind them (%s left now),\n"
        "          %llu kept it whole (being published, or open)\n",
        static_cast<unsigned long long>(ju64(heads, "retirements")),
        human_bytes(jnum(heads, "retired_disk_bytes")).c_str(),
        static_cast<unsigned long long>(ju64(heads, "retire_refused")));
  if (jbool(heads, "enabled") && ju64(heads, "saves_without_image"))
    std::printf("          %s made no image: their checkpoint was the only live file kept\n",
                plural(ju64(heads, "saves_without_image"), "save").c_str());
  if (!jbool(heads, "enabled")) std::printf("heads:    off (restores decode the chains)\n");
  std::printf("scratch:  %s: %s in staging files and head images, %s free\n",
              jstr(scratch, "dir").c_str(), human_bytes(jnum(scratch, "bytes")).c_str(),
              human_bytes(jnum(scratch, "free_bytes")).c_str());
}

}  // namespace

void add_status_command(CLI::App& app) {
  auto o = std::make_shared<status_options>();
  auto* cmd = app.add_subcommand("status", "Show what the running daemon holds.");
  cmd->footer(
      "Asks the daemon serving the mount (or the store) what it holds right now: its memory "
      "budget (cache= + buffer= + 512 MiB) next to its resident memory and peak (VmRSS, "
      "VmHWM), the cache of reconstructions and decoded chunks, write buffers in memory and "
      "spilled to staging files, commits queued and running, encode slots in use, head images "
      "(count, published, memory, disk bytes) and the scratch directory. These numbers exist "
      "only in a running daemon: for a store no daemon serves, status says so and exits 1. Exit "
      "status 0 when the daemon answered.\n");
  cmd->add_option("MOUNT|STORE", o->target,
                  "A ckptfs mount point (or any path inside the mount), or a store directory")
      ->required();
  cmd->add_flag("--json", o->json, "Print the result as one JSON object (sizes in bytes)");
  cmd->callback([o] {
    const target_path t = resolve_path(o->target, "", path_use::store);
    // A store directory: its daemon, if one runs, answers on STORE/control.sock. Never opened
    // offline: a store without a daemon holds nothing in memory.
    store_target live = t.where;
    const bool by_store = live.offline;
    if (by_store) {
      live.offline = false;
      live.mountpoint = find_ckptfs_mount(live.store).value_or("");
    }
    store_client client(live);
    progress_bar bar;
    nlohmann::json r;
    try {
      r = client.call({{"op", "status"}}, bar);
    } catch (const fs::admin::remote_error&) {
      throw;
    } catch (const io_error& e) {
      const bool nobody = e.sys_errno() == ENOENT || e.sys_errno() == ECONNREFUSED;
      if (!by_store || !nobody || !live.mountpoint.empty()) throw;
      throw io_error(e.sys_errno(),
                     "no ckptfs daemon serves " + live.store +
                         ": nothing is held (memory, write buffers, pending encodes and scratch "
                         "bytes exist only in a running daemon); head images left on disk count "
                         "in `ckptctl ls " +
                         live.store + "`");
    }
    exit_status = 0;
    if (o->json)
      print_json(r);
    else
      print_text(r);
  });
}

}  // namespace ckpt::tools
