#pragma once
// Where a management command runs, and running it there (docs/management.md, "Live and
// offline").
//
// Live: the user names paths inside a mounted ckptfs. The daemon answers the virtual xattr
// "user.ckptfs.store" with its store directory; ckptctl sends the request to the daemon's
// control socket STORE/control.sock, naming each path relative to the mount's root.
// Offline: the user names the store directory itself (`ckptctl verify /data/store`), or gives
// `--store STORE` and paths inside the store's namespace (what the mount would show at its
// root). ckptctl opens the store in-process (admin::store_session, which takes the store lock: a
// running daemon makes it refuse) and runs the same admin_service the daemon runs.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/ctl_util.hpp"

namespace ckpt::tools {

struct store_target {
  bool offline = false;
  std::string store;       // absolute store directory
  std::string mountpoint;  // live: the mount's root directory
  bool operator==(const store_target&) const = default;
};

struct target_path {
  store_target where;
  std::string rel;   // the path for the service: relative to the mount root, "" = the root
  std::string arg;   // as the user wrote it (for messages)
  std::string real;  // live: the absolute path with symlinks resolved (for reading it directly)
};

// How a command uses a path argument; decides what a store directory means and whether the
// last component is followed.
enum class path_use {
  file,    // stat, export: must name a file (a store directory is a usage error)
  tree,    // ls, prune: a file or directory; a store directory means its root
  remove,  // rm: a name (a symlink is not followed); a store directory is a usage error
  store,   // verify, gc: the store, given as STORE, MOUNTPOINT or any path inside the mount
};

// Resolves one command-line path. `store_opt` is the --store value ("" if not given). Throws
// usage_error for arguments of the wrong kind (not inside a ckptfs mount and not a store) and
// ckpt::io_error for paths that do not exist.
target_path resolve_path(const std::string& arg, const std::string& store_opt, path_use use);
// Several paths; all must be in one store (usage_error otherwise).
std::vector<target_path> resolve_paths(const std::vector<std::string>& args,
                                       const std::string& store_opt, path_use use);

// Runs requests live (control socket) or offline (store opened in-process, on first use).
class store_client {
 public:
  explicit store_client(store_target where);
  ~store_client();
  store_client(const store_client&) = delete;
  store_client& operator=(const store_client&) = delete;

  // The request's result object. Shows progress on `bar` (a no-op when stderr is not a
  // terminal) and clears it before returning or throwing. Throws ckpt::error subclasses:
  // the service's errors (offline), admin::remote_error (live), transport errors.
  nlohmann::json call(const nlohmann::json& request, progress_bar& bar);

  const store_target& where() const { return where_; }

 private:
  struct offline;
  store_target where_;
  std::unique_ptr<offline> offline_;
};

// Lenient accessors for the service's answers: a missing, null or mistyped field gives `def`
// (the text output must never fail on a field it only displays; --json prints the raw answer).
std::string jstr(const nlohmann::json& j, const char* key, const std::string& def = "?");
std::uint64_t ju64(const nlohmann::json& j, const char* key, std::uint64_t def = 0);
double jnum(const nlohmann::json& j, const char* key, double def = 0);
bool jbool(const nlohmann::json& j, const char* key, bool def = false);
const nlohmann::json& jarr(const nlohmann::json& j, const char* key);  // [] if absent

// Prints `j` as one line of JSON on stdout (invalid UTF-8 in names replaced, never an error).
void print_json(const nlohmann::json& j);

}  // namespace ckpt::tools
