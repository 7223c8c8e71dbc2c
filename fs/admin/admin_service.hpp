#pragma once
// Store management (DESIGN.md §8, `ckptctl ls/stat/prune/rm/verify/export/gc`). One
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
//             "stored_bytes":n}    (versions oldest first; hidden bases included, live=false)
//        V = {"version":n, "paths":[...], "live":bool, "created":unix seconds (float),
//             "format":s, "kind":"keyframe|delta|exact", "base":n, "lineage":n,
//             "logical_bytes":n, "stored_bytes":n}
//        totals = {"versions":n, "live_versions":n, "logical_bytes":n, "stored_bytes":n}
//        With P: the lineages having a live version at or under P, and the exact files there.
//   {"op":"stat", "path":P}
//     -> V plus {"path":P,
//     "coding":{"bits","group","rep","scope","coder","exact_optimizer","relative"},
//               "exact_stored_bytes":n,
//               "tensors":[{"name","dtype","elements","mode":"delta|lossless","stored_bytes"}]}
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

class admin_service {
 public:
  admin_service(filesystem& fs, content_store& content, store::object_store& objects);

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

  // After removing names: waits (briefly) until the kernel let go of the removed files, so
  // that their versions are released and the space they free is counted.
  void settle(const std::vector<content_ref>& removed);
};

}  // namespace ckpt::fs::admin
