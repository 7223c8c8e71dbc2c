// Live/offline target resolution and request execution for ckptctl (ctl_store.hpp).
#include "tools/ctl_store.hpp"

#include <sys/stat.h>
#include <sys/xattr.h>

#include <boost/filesystem/operations.hpp>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>

#include "codec/error.hpp"
#include "fs/admin/admin_service.hpp"
#include "fs/admin/control_protocol.hpp"
#include "fs/admin/store_session.hpp"

namespace bf = boost::filesystem;

namespace ckpt::tools {

namespace {

constexpr const char* kStoreXattr = "user.ckptfs.store";

[[noreturn]] void throw_path_errno(int err, const std::string& arg) {
  throw io_error(err, arg + ": " + std::strerror(err));
}

std::string real_path(const std::string& p, const std::string& arg) {
  char buf[PATH_MAX];
  if (!::realpath(p.c_str(), buf)) throw_path_errno(errno, arg);
  return buf;
}

// The store directory a ckptfs daemon serves `path` from; nullopt if `path` is not in a ckptfs.
std::optional<std::string> store_of(const std::string& path, const std::string& arg) {
  std::vector<char> buf(4096);
  for (;;) {
    const ssize_t n = ::getxattr(path.c_str(), kStoreXattr, buf.data(), buf.size());
    if (n >= 0) return std::string(buf.data(), std::size_t(n));
    if (errno == ERANGE) {
      buf.resize(buf.size() * 4);
      continue;
    }
    if (errno == ENODATA || errno == ENOTSUP || errno == EOPNOTSUPP || errno == EPERM)
      return std::nullopt;
    throw_path_errno(errno, arg);
  }
}

// The directory a mount is rooted at, for a path inside it: walk up while the device stays.
std::string mount_root_of(const std::string& real) {
  struct stat st {};
  if (::stat(real.c_str(), &st) != 0) throw_path_errno(errno, real);
  const dev_t dev = st.st_dev;
  std::string cur = real;
  while (cur != "/") {
    const auto slash = cur.rfind('/');
    const std::string parent = slash == 0 ? "/" : cur.substr(0, slash);
    struct stat pst {};
    if (::stat(parent.c_str(), &pst) != 0 || pst.st_dev != dev) break;
    cur = parent;
  }
  return cur;
}

// The mounted filesystem's directory shown at `mount_point` ("" for its root; a bind mount of a
// subdirectory shows that subdirectory).
std::string mount_subdir_of(const std::string& mount_point) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line, root;
  while (std::getline(in, line)) {
    auto e = parse_mountinfo_line(line);
    if (e && e->mount_point == mount_point && e->fstype.rfind("fuse", 0) == 0) root = e->root;
  }
  return normalize_store_path(root);
}

std::string join_rel(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + "/" + b;
}

}  // namespace

target_path resolve_path(const std::string& arg, const std::string& store_opt, path_use use) {
  target_path t;
  t.arg = arg;
  const bool wants_file = use == path_use::file || use == path_use::remove;
  if (!store_opt.empty()) {
    if (!fs::admin::is_store_dir(store_opt))
      throw usage_error("--store " + store_opt + ": not a ckptfs store (no journal and objects/)");
    t.where = {true, real_path(store_opt, store_opt), ""};
    t.rel = normalize_store_path(arg);
    if (wants_file && t.rel.empty())
      throw usage_error("'" + arg + "' is the store's root; name a file inside it");
    return t;
  }
  if (arg.empty()) throw usage_error("empty path");
  if (fs::admin::is_store_dir(arg)) {
    if (wants_file)
      throw usage_error(arg + " is a store directory; name a file in it as --store " + arg +
                        " PATH (PATH as the mount shows it)");
    t.where = {true, real_path(arg, arg), ""};
    t.rel = "";
    return t;
  }
  // Live: a path inside a mount.
  std::string real, probe;
  if (use == path_use::remove) {  // the name itself, not what a symlink points at
    std::string a = arg;
    while (a.size() > 1 && a.back() == '/') a.pop_back();
    const auto slash = a.rfind('/');
    const std::string dir =
        slash == std::string::npos ? "." : (slash == 0 ? "/" : a.substr(0, slash));
    const std::string base = slash == std::string::npos ? a : a.substr(slash + 1);
    if (base.empty() || base == "." || base == "..")
      throw usage_error("'" + arg + "' does not name a file");
    probe = real_path(dir, arg);
    real = probe == "/" ? "/" + base : probe + "/" + base;
  } else {
    real = real_path(arg, arg);
    probe = real;
  }
  auto store = store_of(probe, arg);
  if (!store)
    throw usage_error(arg + " is neither inside a ckptfs mount nor a ckptfs store directory");
  const std::string root = mount_root_of(probe);
  std::string rel = real.size() > root.size() ? real.substr(root == "/" ? 1 : root.size() + 1) : "";
  t.rel = join_rel(mount_subdir_of(root), rel);
  t.where = {false, *store, root};
  t.real = real;
  if (wants_file && t.rel.empty())
    throw usage_error("'" + arg + "' is the mount's root, not a file");
  return t;
}

std::vector<target_path> resolve_paths(const std::vector<std::string>& args,
                                       const std::string& store_opt, path_use use) {
  std::vector<target_path> out;
  for (const auto& a : args) {
    out.push_back(resolve_path(a, store_opt, use));
    if (out.back().where != out.front().where)
      throw usage_error("'" + out.front().arg + "' and '" + a +
                        "' are in different stores (or one live, one offline); give one at a "
                        "time");
  }
  return out;
}

// ---- store_client ------------------------------------------------------------------------------

struct store_client::offline {
  fs::admin::store_session session;
  fs::admin::admin_service service;

  static fs::admin::store_session_options options() {
    fs::admin::store_session_options o;
    o.create = false;  // never create a store by a typo
    return o;
  }
  explicit offline(const std::string& store)
      : session(store, options()), service(session.fs(), session.content(), session.objects()) {
    // The head images a daemon left (with the default scratch, the store): ls counts them.
    service.set_heads_on_disk(session.heads_dir().string());
  }
};

store_client::store_client(store_target where) : where_(std::move(where)) {}
store_client::~store_client() = default;

nlohmann::json store_client::call(const nlohmann::json& request, progress_bar& bar) {
  const fs::admin::progress_fn progress = [&bar](std::string_view phase, std::uint64_t done,
                                                 std::uint64_t total) {
    bar.update(phase, done, total);
  };
  try {
    nlohmann::json result;
    if (where_.offline) {
      if (!offline_) {
        try {
          offline_ = std::make_unique<offline>(where_.store);
        } catch (const io_error& e) {
          if (e.sys_errno() != EWOULDBLOCK) throw;
          std::string msg = e.what();
          if (auto mnt = find_ckptfs_mount(where_.store)) msg += " (it is mounted at " + *mnt + ")";
          throw io_error(EWOULDBLOCK, msg);
        }
      }
      result = offline_->service.handle(request, progress);
    } else {
      const std::string sock = fs::admin::control_socket_path(where_.store);
      try {
        result = fs::admin::control_call(sock, request, progress);
      } catch (const fs::admin::remote_error&) {
        throw;
      } catch (const io_error& e) {
        if (e.sys_errno() != ENOENT && e.sys_errno() != ECONNREFUSED) throw;
        throw io_error(e.sys_errno(), "cannot reach the ckptfs daemon serving " +
                                          where_.mountpoint + " (" + e.what() + ")");
      }
    }
    bar.clear();
    return result;
  } catch (...) {
    bar.clear();
    throw;
  }
}

std::string jstr(const nlohmann::json& j, const char* key, const std::string& def) {
  if (!j.is_object()) return def;
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : def;
}

std::uint64_t ju64(const nlohmann::json& j, const char* key, std::uint64_t def) {
  if (!j.is_object()) return def;
  auto it = j.find(key);
  return it != j.end() && it->is_number_unsigned() ? it->get<std::uint64_t>() : def;
}

double jnum(const nlohmann::json& j, const char* key, double def) {
  if (!j.is_object()) return def;
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : def;
}

bool jbool(const nlohmann::json& j, const char* key, bool def) {
  if (!j.is_object()) return def;
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : def;
}

const nlohmann::json& jarr(const nlohmann::json& j, const char* key) {
  static const nlohmann::json empty = nlohmann::json::array();
  if (!j.is_object()) return empty;
  auto it = j.find(key);
  return it != j.end() && it->is_array() ? *it : empty;
}

void print_json(const nlohmann::json& j) {
  std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  std::cout.flush();
}

}  // namespace ckpt::tools
