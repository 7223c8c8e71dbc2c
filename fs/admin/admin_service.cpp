#include "fs/admin/admin_service.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <thread>
#include <unordered_map>

#include "codec/error.hpp"
#include "fs/content/head_store.hpp"
#include "fs/namespace/memory_budget.hpp"

namespace ckpt::fs::admin {
namespace {

using nlohmann::json;

// A relative L2 error into `x`: `rel_error`, absent when not recorded (negative); infinite (an
// all-zero tensor stored with an error) does not fit JSON, so a flag says so.
void put_error(json& x, double e) {
  if (std::isinf(e))
    x["rel_error_inf"] = true;
  else if (e >= 0)
    x["rel_error"] = e;
}

std::string normal_path(std::string_view p) {
  std::string out;
  std::size_t i = 0;
  while (i < p.size()) {
    const auto slash = p.find('/', i);
    const auto part = p.substr(i, slash == std::string_view::npos ? p.size() - i : slash - i);
    if (!part.empty() && part != ".") {
      if (!out.empty()) out += '/';
      out += part;
    }
    if (slash == std::string_view::npos) break;
    i = slash + 1;
  }
  return out;
}

bool under(const std::string& path, const std::string& dir) {
  return dir.empty() || path == dir ||
         (path.size() > dir.size() && path.starts_with(dir) && path[dir.size()] == '/');
}

double seconds(std::int64_t ns) {
  return double(ns) / 1e9;
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Offline, no head store runs: the head bytes of a version are those of an image file a daemon
// left in `dir` for it (its size must be the version's logical size, as a published image's
// is). "" leaves the versions as they are.
void count_heads_on_disk(std::span<version_info> versions, const std::string& dir) {
  if (dir.empty()) return;
  const auto images = head_store::files_in(dir);
  for (auto& v : versions) {
    auto it = images.find(v.version);
    if (!v.head_bytes && v.lineage && it != images.end() && it->second == v.logical_bytes)
      v.head_bytes = it->second;
  }
}

// The management view of a store at one moment: versions, and the names pointing at them.
struct snapshot {
  std::vector<version_info> versions;                       // ascending id
  std::map<std::uint64_t, std::vector<std::string>> names;  // version -> paths (sorted)
  std::vector<filesystem::named_file> files;

  // heads_on_disk: offline, a heads directory whose image files count as the versions' head
  // bytes (admin_service::set_heads_on_disk).
  snapshot(filesystem& fs, content_store& content, const std::string& heads_on_disk = {}) {
    files = fs.regular_files();
    versions = content.versions();
    count_heads_on_disk(versions, heads_on_disk);
    for (const auto& f : files)
      if (f.content.version) names[f.content.version].push_back(f.path);
    for (auto& [v, paths] : names) std::sort(paths.begin(), paths.end());
  }

  json version_json(const version_info& v) const {
    auto it = names.find(v.version);
    const auto paths = it == names.end() ? std::vector<std::string>{} : it->second;
    return {{"version", v.version},
            {"paths", paths},
            {"live", !paths.empty()},
            {"created", seconds(v.created_ns)},
            {"format", v.format},
            {"kind", v.kind},
            {"base", v.base},
            {"lineage", v.lineage},
            {"logical_bytes", v.logical_bytes},
            {"stored_bytes", v.stored_bytes},
            {"head_bytes", v.head_bytes},
            {"donors", v.donors}};
  }

  bool live(std::uint64_t v) const { return names.count(v) != 0; }
};

// Disk bytes of objects present now, by id: freed space is what disappears from this set.
std::map<std::uint64_t, std::uint64_t> object_sizes(store::object_store& objects) {
  std::map<std::uint64_t, std::uint64_t> out;
  for (auto id : objects.list()) out[id] = objects.disk_bytes(id);
  return out;
}

std::uint64_t freed_since(const std::map<std::uint64_t, std::uint64_t>& before,
                          store::object_store& objects) {
  const auto now = objects.list();
  const std::set<std::uint64_t> present(now.begin(), now.end());
  std::uint64_t freed = 0;
  for (const auto& [id, bytes] : before)
    if (!present.count(id)) freed += bytes;
  return freed;
}

std::uint64_t get_u64(const json& req, const char* key) {
  const auto it = req.find(key);
  if (it == req.end() || it->is_null()) return 0;
  if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<std::int64_t>() >= 0))
    throw invalid_argument(std::string("'") + key + "' must be a non-negative integer");
  return it->get<std::uint64_t>();
}

std::vector<std::string> get_paths(const json& req) {
  const auto it = req.find("paths");
  if (it == req.end() || !it->is_array() || it->empty())
    throw invalid_argument("'paths' must be a non-empty array of paths");
  std::vector<std::string> out;
  for (const auto& p : *it) {
    if (!p.is_string()) throw invalid_argument("'paths' must hold strings");
    out.push_back(normal_path(p.get<std::string>()));
  }
  return out;
}

std::string get_path(const json& req, bool required) {
  const auto it = req.find("path");
  if (it == req.end() || it->is_null()) {
    if (required) throw invalid_argument("'path' is required");
    return {};
  }
  if (!it->is_string()) throw invalid_argument("'path' must be a string");
  return normal_path(it->get<std::string>());
}

bool get_bool(const json& req, const char* key) {
  const auto it = req.find(key);
  if (it == req.end() || it->is_null()) return false;
  if (!it->is_boolean()) throw invalid_argument(std::string("'") + key + "' must be true or false");
  return it->get<bool>();
}

// The regular file at `path` (ENOENT, EISDIR otherwise) and its committed version.
filesystem::named_file file_at(filesystem& fs, const std::string& path) {
  const ino_t ino = fs.resolve(path);
  for (auto& f : fs.regular_files())
    if (f.ino == ino && f.path == path) return f;
  if (path.empty()) throw io_error(EISDIR, "the root is a directory");
  throw io_error(EISDIR, path + " is not a regular file");
}

// "Vm...:   123 kB" -> bytes; 0 when the line is malformed.
std::uint64_t kib_field(std::string_view rest) {
  std::size_t i = 0;
  while (i < rest.size() && (rest[i] == ' ' || rest[i] == '\t')) ++i;
  std::uint64_t n = 0;
  const std::size_t start = i;
  for (; i < rest.size() && rest[i] >= '0' && rest[i] <= '9'; ++i)
    n = n * 10 + unsigned(rest[i] - '0');
  if (i == start) return 0;
  while (i < rest.size() && rest[i] == ' ') ++i;
  return rest.substr(i).starts_with("kB") ? n * 1024 : 0;
}

}  // namespace

process_memory parse_proc_status(std::string_view text) {
  process_memory m;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    if (line.starts_with("VmRSS:")) m.rss_bytes = kib_field(line.substr(6));
    if (line.starts_with("VmHWM:")) m.peak_rss_bytes = kib_field(line.substr(6));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return m;
}

process_memory read_process_memory() {
  std::ifstream in("/proc/self/status");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_proc_status(text);
}

admin_service::admin_service(filesystem& fs, content_store& content, store::object_store& objects)
    : fs_(fs), content_(content), objects_(objects) {}

void admin_service::settle(const std::vector<content_ref>& removed) {
  if (flush_kernel_) flush_kernel_();
  fs_.sync();  // the removals are durable; versions whose last name went are released
  // Live: a removed file's version is released when the kernel forgets the inode, shortly
  // after the notification above; wait for that (at most 2 s), then sync again so that what
  // nothing needs any more is removed. Offline nothing holds them.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (;;) {
    bool held = false;
    for (const auto& r : removed) {
      try {
        held |= content_.info(r).refs > 0;
      } catch (const corrupt_error&) {
        // reclaimed
      }
    }
    if (!held || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  fs_.sync();
  fs_.sync();  // the second sync removes what the unrefs of the first made unnecessary
}

json admin_service::status() const {
  if (!daemon_)
    throw io_error(ENOTCONN,
                   "status describes a running daemon; this store is open offline, so nothing is "
                   "held");
  const daemon_info& d = *daemon_;
  const process_memory mem = read_process_memory();
  const auto c = content_.usage();
  const auto f = fs_.usage();
  const std::uint64_t bound = d.cache_bytes + d.buffer_bytes + daemon_overhead_bytes;
  // Resident memory outside the pools counted below (code, threads, I/O and decode buffers,
  // what the allocator keeps): what daemon_overhead_bytes allows for. The counts and VmRSS are
  // read a moment apart, so it is approximate.
  const std::uint64_t counted = c.cache_bytes + c.chunk_bytes + f.buffer_bytes + f.pooled_bytes +
                                c.encode_memory + c.scratch_bytes;
  const std::uint64_t uncounted = mem.rss_bytes > counted ? mem.rss_bytes - counted : 0;
  std::uint64_t free_bytes = 0;
  struct statvfs sv {};
  if (::statvfs(d.scratch_dir.c_str(), &sv) == 0)
    free_bytes = std::uint64_t(sv.f_bavail) * std::uint64_t(sv.f_frsize);
  return {{"pid", std::int64_t(::getpid())},
          {"store", d.store_dir},
          {"mountpoint", d.mountpoint},
          {"budget",
           {{"cache_bytes", d.cache_bytes},
            {"buffer_bytes", d.buffer_bytes},
            {"overhead_bytes", daemon_overhead_bytes},
            {"bound_bytes", bound}}},
          {"process",
           {{"rss_bytes", mem.rss_bytes},
            {"peak_rss_bytes", mem.peak_rss_bytes},
            {"uncounted_bytes", uncounted},
            {"peak_within_bound", mem.peak_rss_bytes <= bound}}},
          {"cache",
           {{"bytes", c.cache_bytes},
            {"budget_bytes", c.cache_budget},
            {"lent_to_coding_bytes", c.coding_charged},
            {"in_place_bytes", c.kept_in_place_bytes},
            {"chunk_bytes", c.chunk_bytes},
            {"chunk_budget_bytes", c.chunk_budget}}},
          {"buffers",
           {{"memory_bytes", f.buffer_bytes},
            {"budget_bytes", f.buffer_budget},
            {"spilled_bytes", f.spilled_bytes},
            {"pooled_bytes", f.pooled_bytes}}},
          {"commits", {{"queued", f.commits_queued}, {"running", f.commits_running}}},
          {"rotation",
           {{"rewrites", f.chain_rewrites},
            {"written_bytes", f.chain_rewrite_bytes},
            {"freed_bytes", f.chain_freed_bytes},
            {"pending", f.chain_rewrite_pending}}},
          {"encodes",
           {{"slots", c.encode_slots},
            {"in_use", c.encodes_running},
            {"memory_bytes", c.encode_memory}}},
          {"codec", {{"scratch_bytes", c.scratch_bytes}, {"scratch_threads", c.scratch_threads}}},
          {"reads",
           {{"chunks_decoded", c.chunks_decoded},
            {"decoded_bytes", c.chunk_bytes_decoded},
            {"chunks_decoded_again", c.chunks_decoded_again},
            {"decoded_again_bytes", c.chunk_bytes_decoded_again},
            {"stray_blocks_decoded", c.stray_blocks_decoded},
            {"stray_bytes", c.stray_bytes_decoded},
            {"frames_decoded", c.chunk_frames_decoded},
            {"read_ahead_jobs", c.read_ahead_jobs}}},
          {"streams",
           {{"running", c.streams_running},
            {"used", c.streamed_puts},
            {"dropped", c.streams_dropped},
            {"declined", c.streams_declined},
            {"last_declined", c.last_declined},
            {"large_saves", c.large_saves},
            {"not_kept", c.streams_not_kept},
            {"kept_bytes", c.streams_kept_bytes},
            {"coded_bytes", c.streamed_bytes}}},
          {"heads",
           {{"enabled", d.heads},
            {"min_bytes", d.head_min},
            {"images", c.heads},
            {"published", c.heads_on_disk},
            {"memory_bytes", c.head_memory},
            {"disk_bytes", c.head_disk_bytes},
            {"retired", c.heads_retired},
            {"retired_disk_bytes", c.head_retired_bytes},
            {"retirements", c.head_retirements},
            {"retire_refused", c.head_retire_refused},
            {"saves_without_image", c.saves_without_image}}},
          {"scratch",
           {{"dir", d.scratch_dir},
            {"staging_dir", d.staging_dir},
            {"heads_dir", d.heads_dir},
            {"bytes", f.spilled_bytes + c.head_disk_bytes + c.head_retired_bytes},
            {"free_bytes", free_bytes}}}};
}

json admin_service::handle(const json& req, const progress_fn& progress_in) {
  if (!req.is_object() || !req.contains("op") || !req["op"].is_string())
    throw invalid_argument("a request is a JSON object with an \"op\" string");
  const std::string op = req["op"].get<std::string>();
  const progress_fn progress = progress_in ? progress_in : [](std::string_view, auto, auto) {};

  if (op == "status") return status();

  if (op == "ls") {
    const std::string path = get_path(req, false);
    if (!path.empty()) fs_.resolve(path);  // ENOENT for a path that does not exist
    const snapshot s(fs_, content_, heads_on_disk_);
    auto selected = [&](std::uint64_t v) {
      auto it = s.names.find(v);
      if (it == s.names.end()) return false;
      return std::any_of(it->second.begin(), it->second.end(),
                         [&](const std::string& p) { return under(p, path); });
    };
    std::set<std::uint64_t> lineages;
    for (const auto& v : s.versions)
      if (v.lineage && selected(v.version)) lineages.insert(v.lineage);
    std::map<std::uint64_t, json> lin;
    json files = json::array();
    json totals{{"versions", 0},     {"live_versions", 0}, {"logical_bytes", 0},
                {"stored_bytes", 0}, {"head_bytes", 0},    {"disk_bytes", 0}};
    // Logical bytes count what reads back (live versions); stored, head and disk bytes count
    // everything kept on disk, hidden bases and head images included.
    auto count = [](json& t, const version_info& v, bool live) {
      const auto add = [&t](const char* key, std::uint64_t n) {
        t[key] = t[key].get<std::uint64_t>() + n;
      };
      add("stored_bytes", v.stored_bytes);
      add("head_bytes", v.head_bytes);
      add("disk_bytes", v.stored_bytes + v.head_bytes);
      if (live) {
        add("live_versions", 1);
        add("logical_bytes", v.logical_bytes);
      }
    };
    for (const auto& v : s.versions) {
      const bool live = s.live(v.version);
      if (v.lineage) {
        if (!lineages.count(v.lineage)) continue;
        auto& l = lin[v.lineage];
        if (l.is_null())
          l = {{"lineage", v.lineage}, {"versions", json::array()}, {"live_versions", 0},
               {"logical_bytes", 0},   {"stored_bytes", 0},         {"head_bytes", 0},
               {"disk_bytes", 0}};
        l["versions"].push_back(s.version_json(v));
        count(l, v, live);
      } else {
        if (!selected(v.version)) continue;
        files.push_back(s.version_json(v));
      }
      totals["versions"] = totals["versions"].get<std::uint64_t>() + 1;
      count(totals, v, live);
    }
    // Hidden donors of the exact files listed (blocks those reuse): on disk, so counted.
    std::set<std::uint64_t> donors;
    for (const auto& v : s.versions)
      if (!v.lineage && selected(v.version)) donors.insert(v.donors.begin(), v.donors.end());
    for (const auto& v : s.versions) {
      if (v.lineage || selected(v.version) || !donors.count(v.version)) continue;
      files.push_back(s.version_json(v));
      totals["versions"] = totals["versions"].get<std::uint64_t>() + 1;
      count(totals, v, false);
    }
    json out{{"lineages", json::array()}, {"files", files}, {"totals", totals}};
    for (auto& [id, l] : lin) out["lineages"].push_back(std::move(l));
    return out;
  }

  if (op == "stat") {
    const std::string path = get_path(req, true);
    const auto f = file_at(fs_, path);
    const snapshot s(fs_, content_);
    const version_detail d = content_.detail(f.content);
    version_info info = d.info;
    count_heads_on_disk(std::span(&info, 1), heads_on_disk_);
    json out = s.version_json(info);
    if (!f.content.version) {  // the empty file has no version
      out["paths"] = json::array({path});
      out["live"] = true;
      out["format"] = "empty";
      out["kind"] = "exact";
    }
    out["path"] = path;
    out["coding"] = {{"bits", d.coding.bits},        {"group", d.coding.group},
                     {"rep", d.coding.rep},          {"scope", d.coding.scope},
                     {"coder", d.coding.coder},      {"exact_optimizer", d.coding.exact_optimizer},
                     {"relative", d.coding.relative}};
    if (d.coding.ratio_bits) out["coding"]["ratio_bits"] = d.coding.ratio_bits;
    if (d.coding.keyframe_bits) out["coding"]["keyframe_bits"] = d.coding.keyframe_bits;
    if (!d.coding.grid.empty()) out["coding"]["grid"] = d.coding.grid;
    if (d.coding.refresh_bits) out["coding"]["refresh_bits"] = d.coding.refresh_bits;
    if (d.coding.weight_error > 0) {
      out["coding"]["weight_error"] = d.coding.weight_error;
      out["coding"]["grid_error"] = d.coding.grid_error;
    }
    out["exact_stored_bytes"] = d.exact_stored_bytes;
    json tensors = json::array();
    for (const auto& t : d.tensors) {
      json x{{"name", t.name},
             {"dtype", t.dtype},
             {"elements", t.elements},
             {"mode", t.mode},
             {"stored_bytes", t.stored_bytes}};
      if (!t.state_name.empty()) x["state_name"] = t.state_name;
      put_error(x, t.rel_error);
      tensors.push_back(std::move(x));
    }
    out["tensors"] = std::move(tensors);
    json fidelity = json::array();
    for (const auto& c : d.fidelity) {
      json x{{"class", c.name}, {"tensors", c.tensors}};
      put_error(x, c.rel_error);
      fidelity.push_back(std::move(x));
    }
    out["fidelity"] = std::move(fidelity);
    return out;
  }

  if (op == "rm") {
    const auto paths = get_paths(req);
    const auto before = object_sizes(objects_);
    json removed = json::array(), errors = json::array();
    std::vector<content_ref> gone;
    for (const auto& p : paths) {
      try {
        const auto f = file_at(fs_, p);
        std::uint64_t stored = 0;
        if (f.content.version) {
          try {
            stored = content_.info(f.content).stored_bytes;
          } catch (const corrupt_error&) {
            // rewritten meanwhile: remove_if below notices
          }
        }
        if (!fs_.remove_if(p, f.content))
          throw io_error(EBUSY, p + " changed or is being written; not removed");
        removed.push_back({{"path", p}, {"version", f.content.version}, {"stored_bytes", stored}});
        gone.push_back(f.content);
      } catch (const io_error& e) {
        errors.push_back({{"path", p}, {"error", e.what()}, {"errno", e.sys_errno()}});
      } catch (const std::exception& e) {
        errors.push_back({{"path", p}, {"error", e.what()}, {"errno", EIO}});
      }
    }
    settle(gone);
    return {
        {"removed", removed}, {"errors", errors}, {"freed_bytes", freed_since(before, objects_)}};
  }

  if (op == "prune") {
    const auto paths = get_paths(req);
    const std::uint64_t keep_last = get_u64(req, "keep_last");
    const std::uint64_t keep_every = get_u64(req, "keep_every");
    const std::uint64_t keep_newer = get_u64(req, "keep_newer_than");
    const bool has_newer = req.contains("keep_newer_than") && !req["keep_newer_than"].is_null();
    const bool dry_run = get_bool(req, "dry_run");
    if (!keep_last && !keep_every && !has_newer)
      throw invalid_argument(
          "prune needs a rule: keep_last >= 1, keep_every >= 1 or keep_newer_than");

    const snapshot s(fs_, content_);
    // Selected lineages: that of a file, or every lineage with a live version under a directory.
    std::set<std::uint64_t> lineages;
    std::unordered_map<std::uint64_t, const version_info*> by_id;
    for (const auto& v : s.versions) by_id[v.version] = &v;
    for (const auto& p : paths) {
      const ino_t ino = fs_.resolve(p);
      bool any = false;
      for (const auto& f : s.files) {
        const bool hit = f.ino == ino || under(f.path, p);
        if (!hit || !f.content.version) continue;
        auto it = by_id.find(f.content.version);
        if (it == by_id.end() || !it->second->lineage) continue;
        lineages.insert(it->second->lineage);
        any = true;
      }
      if (!any && !p.empty()) {
        bool is_file = false;
        for (const auto& f : s.files) is_file |= f.ino == ino;
        if (is_file) throw invalid_argument(p + " is not a checkpoint (it has no lineage)");
      }
    }
    const std::int64_t now = now_ns();
    json out_lineages = json::array();
    std::vector<std::pair<std::uint64_t, std::vector<std::string>>> doomed;  // version, paths
    std::vector<std::uint64_t> oldest_kept;
    for (auto lid : lineages) {
      std::vector<const version_info*> live;
      for (const auto& v : s.versions)
        if (v.lineage == lid && s.live(v.version)) live.push_back(&v);
      json kept = json::array(), removed = json::array();
      std::optional<std::uint64_t> first_kept;
      for (std::size_t i = 0; i < live.size(); ++i) {
        const auto& v = *live[i];
        const bool keep = (keep_last && i + keep_last >= live.size()) ||
                          (keep_every && i % keep_every == 0) ||
                          (has_newer && v.created_ns &&
                           now - v.created_ns < std::int64_t(keep_newer) * 1'000'000'000);
        const auto& names = s.names.at(v.version);
        if (keep) {
          if (!first_kept) first_kept = v.version;
          for (const auto& n : names) kept.push_back({{"path", n}, {"version", v.version}});
        } else {
          for (const auto& n : names)
            removed.push_back(
                {{"path", n}, {"version", v.version}, {"stored_bytes", v.stored_bytes}});
          doomed.push_back({v.version, names});
        }
      }
      // Nothing live precedes the oldest kept version: as a keyframe it frees its whole chain.
      if (first_kept && by_id.at(*first_kept)->kind == "delta") oldest_kept.push_back(*first_kept);
      out_lineages.push_back({{"lineage", lid}, {"kept", kept}, {"removed", removed}});
    }
    json rekeyed = json::array();
    std::uint64_t freed = 0;
    if (!dry_run) {
      const auto before = object_sizes(objects_);
      std::uint64_t total = doomed.size() + oldest_kept.size(), done = 0;
      std::vector<content_ref> unnamed;
      for (const auto& [v, names] : doomed) {
        const content_ref ref{v, by_id.at(v)->logical_bytes};
        for (const auto& n : names) {
          try {
            if (fs_.remove_if(n, ref)) unnamed.push_back(ref);
          } catch (const io_error&) {
            // Renamed or removed meanwhile: not ours to remove any more.
          }
        }
        progress("prune", ++done, total);
      }
      settle(unnamed);  // names gone for good, and the versions nothing needs are reclaimed
      std::uint64_t written = 0;
      for (auto v : oldest_kept) {
        try {
          const std::uint64_t b = fs_.rekey(v);
          if (b) {
            written += b;
            rekeyed.push_back(v);
          }
        } catch (const corrupt_error&) {
          // A damaged (or meanwhile rewritten) version is not rewritten; verify reports damage.
        }
        progress("prune", ++done, total);
      }
      fs_.sync();  // objects released meanwhile (readers closing) go too
      const std::uint64_t vanished = freed_since(before, objects_);
      freed = vanished > written ? vanished - written : 0;
    }
    return {{"lineages", out_lineages},
            {"rekeyed", rekeyed},
            {"freed_bytes", freed},
            {"dry_run", dry_run}};
  }

  if (op == "verify") {
    const bool deep = get_bool(req, "deep");
    const snapshot s(fs_, content_);
    std::uint64_t total = 0, done = 0;
    for (const auto& v : s.versions) total += v.stored_bytes;
    std::map<std::uint64_t, std::string> bad;  // version -> problem
    if (deep) {
      // Chains, each version's successor its oldest dependent (forks start chains of their
      // own), decoded along the chain: linear in the chain's length (verify_chain).
      std::map<std::uint64_t, std::uint64_t> bytes;
      std::map<std::uint64_t, std::vector<std::uint64_t>> dependents;
      for (const auto& v : s.versions) bytes[v.version] = v.stored_bytes;
      for (const auto& v : s.versions)
        if (v.base && bytes.count(v.base)) dependents[v.base].push_back(v.version);
      std::set<std::uint64_t> chained;
      for (const auto& [first, size] : bytes) {
        if (chained.count(first)) continue;
        std::vector<std::uint64_t> chain{first};
        chained.insert(first);
        for (;;) {
          auto it = dependents.find(chain.back());
          if (it == dependents.end()) break;
          const auto next = std::min_element(it->second.begin(), it->second.end());
          if (chained.count(*next)) break;
          chain.push_back(*next);
          chained.insert(*next);
        }
        std::uint64_t chain_bytes = 0, decoded = 0, shown = 0;
        for (auto v : chain) chain_bytes += bytes[v];
        const auto problems = content_.verify_chain(chain, [&](std::uint64_t b) {
          decoded = std::min(chain_bytes, decoded + b);
          if (decoded - shown >= std::max<std::uint64_t>(1, total / 200)) {
            shown = decoded;
            progress("verify --deep", done + decoded, total);
          }
        });
        for (std::size_t i = 0; i < chain.size(); ++i)
          if (!problems[i].empty()) bad[chain[i]] = problems[i];
        done += chain_bytes;
        progress("verify --deep", done, total);
      }
      // A damaged base's dependents in other chains (forks) are damaged too, and said so (their
      // own decode through it failed for that reason), as within a chain.
      for (const auto& v : s.versions)
        if (v.base && bad.count(v.base))
          bad[v.version] = "its base version " + std::to_string(v.base) + " is damaged";
    } else {
      for (const auto& v : s.versions) {
        std::string problem;
        if (v.base && bad.count(v.base)) {
          problem = "its base version " + std::to_string(v.base) + " is damaged";
        } else {
          problem = content_.verify(v.version, deep, [&](std::uint64_t) {});
        }
        done += v.stored_bytes;
        progress("verify", done, total);
        if (!problem.empty()) bad[v.version] = problem;
      }
    }
    // Training may write, rewrite and delete files meanwhile: a version reclaimed or rewritten
    // (prune's rekey) during the pass is not damage. Every finding is confirmed once more on
    // the store as it is now; oldest first, so a confirmed base explains its dependents.
    std::map<std::uint64_t, std::string> confirmed;
    for (const auto& [v, first] : bad) {
      version_info now;
      try {
        now = content_.info({v, 0});
      } catch (const corrupt_error&) {
        continue;  // reclaimed meanwhile
      }
      if (now.base && confirmed.count(now.base)) {
        confirmed[v] = "its base version " + std::to_string(now.base) + " is damaged";
      } else if (auto again = content_.verify(v, deep); !again.empty()) {
        confirmed[v] = again;
      }
    }
    bad = std::move(confirmed);
    json damaged = json::array();
    std::set<std::uint64_t> known;
    for (const auto& v : s.versions) known.insert(v.version);
    for (const auto& f : s.files) {
      if (!f.content.version) continue;
      std::string problem;
      if (!known.count(f.content.version)) {
        problem = "its version " + std::to_string(f.content.version) + " is not in the store";
        // Unless the name moved on or went meanwhile, or the version exists now.
        try {
          if (!(fs_.content_of(fs_.resolve(f.path)) == f.content)) problem.clear();
        } catch (const io_error&) {
          problem.clear();
        }
        try {
          content_.info(f.content);
          problem.clear();
        } catch (const corrupt_error&) {
        }
      } else if (auto it = bad.find(f.content.version); it != bad.end()) {
        problem = it->second;
      }
      if (!problem.empty())
        damaged.push_back({{"path", f.path}, {"version", f.content.version}, {"problem", problem}});
    }
    // Damaged hidden versions (no name) matter through their dependents, reported above; a
    // damaged lineage head without names would break the next delta: report it too.
    for (const auto& [v, problem] : bad)
      if (!s.live(v))
        damaged.push_back(
            {{"path", nullptr}, {"version", v}, {"problem", "(hidden base) " + problem}});
    const auto garbage = content_.collect_garbage(true);
    std::uint64_t bytes = 0;
    for (const auto& v : s.versions) bytes += v.stored_bytes;
    return {{"ok", damaged.empty()},        {"versions", s.versions.size()},
            {"objects", s.versions.size()}, {"bytes", bytes},
            {"damaged", damaged},           {"unreferenced_objects", garbage.first}};
  }

  if (op == "gc") {
    const bool dry_run = get_bool(req, "dry_run");
    fs_.sync();  // objects waiting for a sync to be removed go first
    progress("gc", 0, 1);
    const auto [count, bytes] = content_.collect_garbage(dry_run);
    progress("gc", 1, 1);
    return {{"removed_objects", count}, {"freed_bytes", bytes}, {"dry_run", dry_run}};
  }

  if (op == "export") {
    const std::string path = get_path(req, true);
    const auto dest_it = req.find("dest");
    if (dest_it == req.end() || !dest_it->is_string() || dest_it->get<std::string>().empty() ||
        dest_it->get<std::string>()[0] != '/')
      throw invalid_argument("'dest' must be an absolute path");
    const std::string dest = dest_it->get<std::string>();
    const auto f = file_at(fs_, path);
    const auto reader = content_.open(f.content);
    const std::string tmp = dest + ".ckptctl-export.tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw io_error(errno, "cannot create " + tmp);
    struct closer {
      int fd;
      std::string tmp;
      bool done = false;
      ~closer() {
        if (fd >= 0) ::close(fd);
        if (!done) ::unlink(tmp.c_str());
      }
    } guard{fd, tmp};
    std::vector<std::byte> buf(std::size_t(8) << 20);
    const std::uint64_t size = reader->size();
    for (std::uint64_t at = 0; at < size;) {
      const std::size_t n = reader->read(at, buf);
      if (n == 0) throw corrupt_error("short read of " + path);
      for (std::size_t w = 0; w < n;) {
        const ssize_t k = ::write(fd, buf.data() + w, n - w);
        if (k < 0) {
          if (errno == EINTR) continue;
          throw io_error(errno, "cannot write " + tmp);
        }
        w += std::size_t(k);
      }
      at += n;
      progress("export", at, size);
    }
    if (::fsync(fd) != 0) throw io_error(errno, "cannot fsync " + tmp);
    ::close(guard.fd);
    guard.fd = -1;
    if (::rename(tmp.c_str(), dest.c_str()) != 0) throw io_error(errno, "cannot rename to " + dest);
    guard.done = true;
    return {{"bytes", size}, {"path", path}, {"dest", dest}};
  }

  throw invalid_argument("unknown op '" + op +
                         "' (ls, stat, rm, prune, verify, gc, export, status)");
}

}  // namespace ckpt::fs::admin
