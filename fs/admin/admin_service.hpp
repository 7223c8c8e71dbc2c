#pragma once
// Store management (DESIGN.md §8, `ckptctl ls/stat/prune/rm/verify/export/gc/status`). One
// implementation serves both modes: the live daemon runs requests that arrive on its control
// socket, and ckptctl's offline mode runs them in-process on a store it opened itself (holding the
// store lock). No FUSE here: removals go through fs::filesystem like an unlink through the mount,
// so a live mount's listing changes at once and writers are never disturbed.
//
// Requests and results are JSON objects; the protocol is documented in docs/management.md.
// Paths are relative to the mount root, '/'-separated, without a leading slash ("" = the root).
//
//   {"op":"ls", "path":P?}
//     -> {"lineages":[L...], "files":[V...], "totals":{...}}
//        L = {"lineage":n, "versions":[V...], "live_versions":n, "logical_bytes":n,
//             "stored_bytes":n, "head_bytes":n, "disk_bytes":n}
//            (versions oldest first; hidden bases included, live=false)
//        V = {"version":n, "paths":[...], "live":bool, "created":unix seconds (float),
//             "format":s, "kind":"keyframe|delta|exact", "base":n, "lineage":n,
//             "logical_bytes":n, "stored_bytes":n, "head_bytes":n}
//        totals = {"versions":n, "live_versions":n, "logical_bytes":n, "stored_bytes":n,
//                  "head_bytes":n, "disk_bytes":n}
//        With P: the lineages having a live version at or under P, and the exact files there.
//        stored_bytes: the versions' objects. head_bytes: the published head image of a
//        lineage's newest version (head_store.hpp), a file of its full logical size in the
//        scratch directory; 0 for every other version. disk_bytes = stored_bytes + head_bytes,
//        what the store costs on disk: every ratio shown is logical / disk. Logical bytes count
//        live versions, stored and head bytes everything kept (hidden bases and heads too).
//        Offline (no head store runs) the head bytes are those of the image files found in the
//        heads directory (set_heads_on_disk) whose version exists and whose size is that
//        version's logical size.
//   {"op":"status"}   (live only: see set_daemon)
//     -> {"pid":n, "store":s, "mountpoint":s,
//         "budget":{"cache_bytes":n, "buffer_bytes":n, "overhead_bytes":n, "bound_bytes":n},
//         "process":{"rss_bytes":n, "peak_rss_bytes":n, "peak_within_bound":bool},
//         "cache":{"bytes":n, "budget_bytes":n, "chunk_bytes":n, "chunk_budget_bytes":n},
//         "buffers":{"memory_bytes":n, "budget_bytes":n, "spilled_bytes":n, "pooled_bytes":n},
//         "commits":{"queued":n, "running":n},
//         "encodes":{"slots":n, "in_use":n, "memory_bytes":n},
//         "heads":{"enabled":bool, "min_bytes":n, "images":n, "published":n, "memory_bytes":n,
//                  "disk_bytes":n, "retired":n, "retired_disk_bytes":n, "retirements":n,
//                  "retire_refused":n},
//         "scratch":{"dir":s, "staging_dir":s, "heads_dir":s, "bytes":n, "free_bytes":n}}
//     What the daemon holds right now. budget: the options cache= and buffer=, the constant
//     (daemon_overhead_bytes) and their sum, the bound on the daemon's resident memory.
//     process: VmRSS and VmHWM of /proc/self/status. cache: reconstructions, metadata and
//     blocks, and the decoded-chunk cache carved out of cache= (budget_bytes +
//     chunk_budget_bytes = cache=). buffers: write-buffer memory taken from buffer= (unpublished
//     head images included), chunks spilled to staging files, freed chunks kept for reuse.
//     commits: closed files waiting for a worker, files being stored. encodes: the encode slots
//     and the bytes their slab buffers have allocated (resident once touched). heads: images of
//     lineage heads (published: on disk; memory_bytes: write-buffer memory of those not yet
//     published, part of buffers.memory_bytes; disk_bytes: the published images; retired: images
//     a save reads its base from, freed behind it, and retired_disk_bytes what they still hold;
//     retirements and retire_refused: since the start, bases retired, and bases a save found
//     being published or open elsewhere and left whole).
//     scratch: SCRATCH and its two directories; bytes = buffers.spilled_bytes +
//     heads.disk_bytes + heads.retired_disk_bytes;
//     free_bytes: what its file system has left for us. Cheap: counters, /proc and a statvfs;
//     no store I/O, never the namespace lock.
//   {"op":"stat", "path":P}
//     -> V plus {"path":P,
//     "coding":{"bits","group","rep","scope","coder","exact_optimizer","relative"},
//               "exact_stored_bytes":n,
//               "tensors":[{"name","dtype","elements","mode":"delta|ratio|intra|ratio+intra|rounded|lossless","stored_bytes"}]}
//   {"op":"rm", "paths":[P...]}
//     -> {"removed":[{"path","version","stored_bytes"}], "errors":[{"path","error","errno"}],
//         "freed_bytes":n}
//   {"op":"prune", "paths":[P...], "keep_last":n?, "keep_every":n?, "keep_newer_than":seconds?,
//    "dry_run":bool?}
//     A version is kept when any given rule keeps it (at least one rule is required): the newest
//     keep_last live versions of its lineage; every keep_every-th live version counting from
//     the oldest (the oldest is kept); versions created less than keep_newer_than seconds ago.
//     The others lose all their names. The oldest kept version of a lineage, if it is a delta,
//     is rewritten as a keyframe holding exactly what it reads as, so the versions before it
//     are reclaimed.
//     -> {"lineages":[{"lineage":n, "kept":[{"path","version"}], "removed":[{"path","version",
//         "stored_bytes"}]}], "rekeyed":[version...], "freed_bytes":n, "dry_run":bool}
//   {"op":"verify", "deep":bool?}
//     -> {"ok":bool, "versions":n, "objects":n, "bytes":n,
//         "damaged":[{"path":P, "version":n, "problem":s}],   (one per damaged name)
//         "unreferenced_objects":n}                          (garbage: not damage)
//   {"op":"gc", "dry_run":bool?}
//     -> {"removed_objects":n, "freed_bytes":n}
//   {"op":"export", "path":P, "dest":absolute path}
//     -> {"bytes":n}   (DEST is written whole, then renamed into place)
//
// freed_bytes are measured on disk (object files before and after, keyframes written by prune
// subtracted). Bad requests throw ckpt::invalid_argument; a path that does not exist or is not a
// regular file throws ckpt::io_error(ENOENT / EISDIR).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fs/content/content_store.hpp"
#include "fs/namespace/filesystem.hpp"
#include "fs/store/object_store.hpp"

namespace ckpt::fs::admin {

// Called now and then by long operations (verify, export, prune, gc): `done` of `total` units
// (bytes or versions) of `phase`. Must not throw.
using progress_fn =
    std::function<void(std::string_view phase, std::uint64_t done, std::uint64_t total)>;

// What only the running daemon knows about itself, for "status" (fs/fuse/main.cpp sets it).
struct daemon_info {
  std::uint64_t cache_bytes = 0;   // -o cache=
  std::uint64_t buffer_bytes = 0;  // -o buffer=
  std::string store_dir;
  std::string mountpoint;
  std::string scratch_dir, staging_dir, heads_dir;  // SCRATCH, SCRATCH/staging, SCRATCH/heads
  bool heads = false;                               // -o heads=on
  std::uint64_t head_min = 0;                       // -o head_min=
};

// VmRSS and VmHWM of a /proc/PID/status text, in bytes (0 for a line that is missing).
struct process_memory {
  std::uint64_t rss_bytes = 0;
  std::uint64_t peak_rss_bytes = 0;
};
process_memory parse_proc_status(std::string_view text);
process_memory read_process_memory();  // this process's; zeros if /proc is unreadable

class admin_service {
 public:
  admin_service(filesystem& fs, content_store& content, store::object_store& objects);

  // The daemon: enables "status". Without it (ckptctl offline) "status" fails with ENOTCONN,
  // since only a running daemon holds memory, buffers and encodes.
  void set_daemon(daemon_info info) { daemon_ = std::move(info); }
  // Offline: where a daemon left its head images (SCRATCH/heads), so that "ls" counts their disk
  // bytes although no head store runs. Live, the content store reports its own.
  void set_heads_on_disk(std::string dir) { heads_on_disk_ = std::move(dir); }

  // Live mounts: called after names were removed, to push the queued kernel notifications out
  // (the kernel then forgets the inodes, which releases their versions). Offline: not set.
  void set_flush_kernel(std::function<void()> flush) { flush_kernel_ = std::move(flush); }

  // Runs one request; thread-safe (the control socket may serve several clients at once).
  nlohmann::json handle(const nlohmann::json& request, const progress_fn& progress = {});

 private:
  filesystem& fs_;
  content_store& content_;
  store::object_store& objects_;
  std::function<void()> flush_kernel_;
  std::optional<daemon_info> daemon_;
  std::string heads_on_disk_;

  nlohmann::json status() const;

  // After removing names: waits (briefly) until the kernel let go of the removed files, so
  // that their versions are released and the space they free is counted.
  void settle(const std::vector<content_ref>& removed);
};

}  // namespace ckpt::fs::admin
