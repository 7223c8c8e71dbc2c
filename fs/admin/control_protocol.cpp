// The control channel's shared pieces: message encoding, parsing, line splitting, progress
// throttling, exception mapping and UNIX socket plumbing (see control_protocol.hpp).
#include "fs/admin/control_protocol.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

namespace ckpt::fs::admin {

namespace {

[[noreturn]] void throw_errno(int err, const std::string& what) {
  throw io_error(err, what + ": " + std::strerror(err));
}

[[noreturn]] void protocol_error(const std::string& what) {
  throw io_error(EPROTO, "control protocol: " + what);
}

// sockaddr_un for `path`. A path longer than sun_path goes through an O_PATH descriptor of its
// directory (kept open in `dir` while the address is used): /proc/self/fd/N/NAME.
sockaddr_un address_of(const std::string& path, unique_fd& dir) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string target = path;
  if (target.size() >= sizeof addr.sun_path) {
    const auto slash = path.rfind('/');
    const std::string parent = slash == std::string::npos ? "." : path.substr(0, slash + 1);
    const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
    dir.reset(::open(parent.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!dir) throw_errno(errno, "cannot open " + parent);
    target = "/proc/self/fd/" + std::to_string(dir.get()) + "/" + name;
    if (target.size() >= sizeof addr.sun_path)
      throw io_error(ENAMETOOLONG, "socket name too long: " + path);
  }
  std::memcpy(addr.sun_path, target.c_str(), target.size() + 1);
  return addr;
}

}  // namespace

std::string control_socket_path(std::string_view store_dir) {
  std::string p(store_dir);
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  if (!p.empty() && p.back() != '/') p += '/';
  p += control_socket_name;
  return p;
}

// ---- messages ----------------------------------------------------------------------------------

std::string progress_line(std::string_view phase, std::uint64_t done, std::uint64_t total) {
  nlohmann::json j = {{"progress", {{"phase", phase}, {"done", done}, {"total", total}}}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string result_line(const nlohmann::json& result) {
  nlohmann::json j = {{"ok", true}, {"result", result}};
  // replace: a path with invalid UTF-8 must not turn a finished operation into an exception.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string error_line(std::string_view message, int err) {
  nlohmann::json j = {{"ok", false}, {"error", message}, {"errno", err}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

response parse_response_line(std::string_view line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) protocol_error("malformed line from the daemon");
  if (!j.is_object()) protocol_error("a line from the daemon is not a JSON object");
  response r;
  if (auto p = j.find("progress"); p != j.end()) {
    if (!p->is_object()) protocol_error("progress is not an object");
    auto phase = p->find("phase"), done = p->find("done"), total = p->find("total");
    if (phase == p->end() || !phase->is_string() || done == p->end() ||
        !done->is_number_unsigned() || total == p->end() || !total->is_number_unsigned())
      protocol_error("progress needs phase (string), done and total (unsigned)");
    r.type = response::kind::progress;
    r.phase = phase->get<std::string>();
    r.done = done->get<std::uint64_t>();
    r.total = total->get<std::uint64_t>();
    return r;
  }
  auto ok = j.find("ok");
  if (ok == j.end() || !ok->is_boolean()) protocol_error("a line without \"ok\" or \"progress\"");
  if (ok->get<bool>()) {
    auto res = j.find("result");
    if (res == j.end() || !res->is_object()) protocol_error("an ok answer without a result object");
    r.type = response::kind::result;
    r.result = std::move(*res);
    return r;
  }
  auto msg = j.find("error");
  auto err = j.find("errno");
  if (msg == j.end() || !msg->is_string()) protocol_error("an error answer without a message");
  r.type = response::kind::error;
  r.message = msg->get<std::string>();
  r.err = err != j.end() && err->is_number_integer() ? err->get<int>() : EIO;
  if (r.err <= 0) r.err = EIO;
  return r;
}

nlohmann::json parse_request_line(std::string_view line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw invalid_argument("request is not valid JSON");
  if (!j.is_object()) throw invalid_argument("request is not a JSON object");
  auto op = j.find("op");
  if (op == j.end() || !op->is_string()) throw invalid_argument("request has no \"op\" string");
  return j;
}

error_reply error_reply_of(std::exception_ptr e) noexcept {
  try {
    try {
      std::rethrow_exception(e);
    } catch (const io_error& x) {
      return {x.what(), x.sys_errno() > 0 ? x.sys_errno() : EIO};
    } catch (const invalid_argument& x) {
      return {x.what(), EINVAL};
    } catch (const nlohmann::json::type_error& x) {
      return {std::string("bad request: ") + x.what(), EINVAL};
    } catch (const nlohmann::json::out_of_range& x) {
      return {std::string("bad request: ") + x.what(), EINVAL};
    } catch (const std::bad_alloc&) {
      return {"out of memory", ENOMEM};
    } catch (const std::exception& x) {
      return {x.what(), EIO};
    } catch (...) {
      return {"unknown error", EIO};
    }
  } catch (...) {  // std::string allocation failed
    return {std::string(), ENOMEM};
  }
}

// ---- line splitting ----------------------------------------------------------------------------

std::optional<std::string> line_splitter::next() {
  const auto nl = buf_.find('\n', start_);
  if (nl == std::string::npos) {
    if (buf_.size() - start_ > max_line_)
      throw io_error(EMSGSIZE,
                     "control protocol: line longer than " + std::to_string(max_line_) + " bytes");
    if (start_ > 0 && start_ == buf_.size()) {
      buf_.clear();
      start_ = 0;
    }
    return std::nullopt;
  }
  if (nl - start_ > max_line_)
    throw io_error(EMSGSIZE,
                   "control protocol: line longer than " + std::to_string(max_line_) + " bytes");
  std::string line = buf_.substr(start_, nl - start_);
  start_ = nl + 1;
  if (start_ > (std::size_t(1) << 16) && start_ * 2 > buf_.size()) {  // compact now and then
    buf_.erase(0, start_);
    start_ = 0;
  }
  return line;
}

// ---- progress ----------------------------------------------------------------------------------

bool progress_throttle::admit(std::string_view phase, std::uint64_t done, std::uint64_t total,
                              clock::time_point now) {
  const bool complete = done >= total;
  if (!any_ || phase != phase_) {
    any_ = true;
    phase_ = phase;
    completed_ = complete;
    last_ = now;
    return true;
  }
  if (complete) {
    if (completed_) return false;  // the end of this phase was already sent
    completed_ = true;
    last_ = now;
    return true;
  }
  completed_ = false;  // a phase may restart (done went back down)
  if (now - last_ < interval_) return false;
  last_ = now;
  return true;
}

// ---- sockets -----------------------------------------------------------------------------------

unique_fd listen_unix(const std::string& path, int backlog) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      throw io_error(EEXIST, path + " exists and is not a socket; not removing it");
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      throw_errno(errno, "cannot remove stale socket " + path);
  }
  unique_fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw_errno(errno, "socket");
  unique_fd dir;
  const sockaddr_un addr = address_of(path, dir);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0)
    throw_errno(errno, "cannot bind " + path);
  // The node was created with the umask's mode. Nobody can connect before listen(), so making it
  // 0600 here leaves no window in which another user could.
  if (::chmod(path.c_str(), 0600) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    throw_errno(err, "cannot chmod " + path);
  }
  if (::listen(fd.get(), backlog) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    throw_errno(err, "cannot listen on " + path);
  }
  return fd;
}

unique_fd connect_unix(const std::string& path) {
  unique_fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw_errno(errno, "socket");
  unique_fd dir;
  const sockaddr_un addr = address_of(path, dir);
  while (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    if (errno == EINTR) continue;
    throw_errno(errno, "cannot connect to " + path);
  }
  return fd;
}

int send_all(int fd, std::string_view data, bool drop_if_busy) noexcept {
  bool started = false;
  while (!data.empty()) {
    int flags = MSG_NOSIGNAL;
    if (drop_if_busy && !started) flags |= MSG_DONTWAIT;
    const ssize_t n = ::send(fd, data.data(), data.size(), flags);
    if (n < 0) {
      if (errno == EINTR) continue;
      if ((errno == EAGAIN || errno == EWOULDBLOCK) && drop_if_busy && !started) return EAGAIN;
      return errno;
    }
    started = true;
    data.remove_prefix(std::size_t(n));
  }
  return 0;
}

// ---- client ------------------------------------------------------------------------------------

nlohmann::json control_call(const std::string& socket_path, const nlohmann::json& request,
                            const progress_callback& progress) {
  unique_fd fd = connect_unix(socket_path);
  const std::string line = request.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (line.size() > max_request_bytes)
    throw invalid_argument("request too large (" + std::to_string(line.size()) + " bytes)");
  if (int err = send_all(fd.get(), line + "\n"); err != 0)
    throw_errno(err, "cannot send the request to " + socket_path);
  line_splitter lines(max_response_bytes);
  char buf[1 << 16];
  for (;;) {
    while (auto l = lines.next()) {
      response r = parse_response_line(*l);
      switch (r.type) {
        case response::kind::progress:
          if (progress) progress(r.phase, r.done, r.total);
          break;
        case response::kind::result:
          return std::move(r.result);
        case response::kind::error:
          throw remote_error(r.err, r.message);
      }
    }
    const ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno(errno, "cannot read the answer from " + socket_path);
    }
    if (n == 0)
      throw io_error(ECONNRESET,
                     "the daemon closed the control connection without answering "
                     "(did it stop or crash? see STORE/ckptfs.log)");
    lines.append(std::string_view(buf, std::size_t(n)));
  }
}

}  // namespace ckpt::fs::admin
