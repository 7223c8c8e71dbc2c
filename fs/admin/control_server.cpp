// The control socket server: accept loop, one thread per connection, request -> handler ->
// progress lines + final line (control_server.hpp has the contracts).
#include "fs/admin/control_server.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "fs/namespace/log.hpp"

namespace ckpt::fs::admin {

namespace {

using clock = std::chrono::steady_clock;

std::string op_of(const nlohmann::json& request) {
  auto op = request.find("op");
  return op != request.end() && op->is_string() ? op->get<std::string>() : std::string("?");
}

// Peers must be root or the daemon's own user (the socket's 0600 says the same; this also holds
// if someone loosens the mode).
bool peer_allowed(int fd, pid_t& pid) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  pid = cred.pid;
  return cred.uid == 0 || cred.uid == ::geteuid();
}

void set_send_timeout(int fd, std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((t.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

}  // namespace

control_server::control_server(std::string socket_path, handler_fn handler, options opt)
    : path_(std::move(socket_path)), handler_(std::move(handler)), opt_(std::move(opt)) {
  wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_) throw io_error(errno, std::string("eventfd: ") + std::strerror(errno));
  listen_fd_ = listen_unix(path_);
  acceptor_ = std::jthread([this] { accept_loop(); });
}

control_server::~control_server() {
  stop_accepting();
  reap(/*all=*/true);
}

void control_server::stop_accepting() {
  if (stopping_.exchange(true)) return;
  // The eventfd stays readable from now on: every poll on it returns at once.
  const std::uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wake_fd_.get(), &one, sizeof one);
  if (acceptor_.joinable()) acceptor_.join();
  // We hold the store lock, so a socket at path_ is ours (never a regular file: listen_unix
  // refused to replace one).
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(path_.c_str());
  listen_fd_.reset();
}

void control_server::accept_loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
    const int n = ::poll(fds, 2, 1000);
    if (stopping_.load()) return;
    reap(/*all=*/false);
    if (n < 0) {
      if (errno == EINTR) continue;
      log_error(std::string("control socket: poll: ") + std::strerror(errno));
      return;
    }
    if (n == 0 || !(fds[0].revents & POLLIN)) continue;
    unique_fd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd) {
      // EMFILE and friends: back off a little instead of spinning on a readable listener.
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) ::usleep(100 * 1000);
      continue;
    }
    try {
      admit(std::move(fd));
    } catch (const std::exception& e) {  // bad_alloc, no thread: drop this client, keep serving
      log_error(std::string("control socket: ") + e.what());
    }
  }
}

void control_server::admit(unique_fd fd) {
  set_send_timeout(fd.get(), opt_.send_timeout);
  pid_t pid = 0;
  if (!peer_allowed(fd.get(), pid)) {
    send_all(fd.get(), error_line("permission denied: only root or the daemon's user may manage "
                                  "the store",
                                  EACCES));
    return;
  }
  std::lock_guard lk(mu_);
  if (conns_.size() >= opt_.max_connections) {
    send_all(fd.get(), error_line("the daemon is busy with " + std::to_string(conns_.size()) +
                                      " management requests; try again later",
                                  EBUSY));
    return;
  }
  auto c = std::make_unique<connection>();
  c->fd = std::move(fd);
  connection& ref = *c;
  conns_.push_back(std::move(c));
  try {
    ref.thread = std::jthread([this, &ref] { serve(ref); });
  } catch (const std::system_error& e) {  // no thread: answer and drop the connection
    send_all(ref.fd.get(), error_line(std::string("cannot start a thread: ") + e.what(), EAGAIN));
    conns_.pop_back();
  }
}

void control_server::reap(bool all) {
  std::vector<std::unique_ptr<connection>> finished;
  {
    std::lock_guard lk(mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (all || (*it)->done.load()) {
        finished.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished)
    if (c->thread.joinable()) c->thread.join();  // a running request finishes and answers first
}

bool control_server::read_request(int fd, std::string& line) {
  line_splitter lines(max_request_bytes);
  const auto deadline = clock::now() + opt_.request_timeout;
  char buf[4096];
  for (;;) {
    if (auto l = lines.next()) {  // throws EMSGSIZE past max_request_bytes
      line = std::move(*l);
      return true;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    if (left.count() <= 0) return false;
    pollfd fds[2] = {{fd, POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
    const int n = ::poll(fds, 2, int(std::min<long long>(left.count(), 1000)));
    if (n < 0 && errno != EINTR) return false;
    if (fds[1].revents & POLLIN) return false;  // stopping: the request never started
    if (n <= 0 || !(fds[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    const ssize_t r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return false;
    }
    if (r == 0) return false;  // the client went away without a whole request
    lines.append(std::string_view(buf, std::size_t(r)));
  }
}

void control_server::serve(connection& c) {
  try {
    serve_request(c.fd.get());
  } catch (...) {  // only allocation failures get here; never take the daemon down
  }
  c.fd.reset();  // the client sees EOF after the final line
  c.done = true;
}

void control_server::serve_request(int fd) {
  std::string line;
  std::string final;
  std::string op = "?";
  bool have_request = false;
  try {
    have_request = read_request(fd, line);
  } catch (...) {
    const error_reply e = error_reply_of(std::current_exception());
    final = error_line(e.message, e.err);
  }
  if (have_request) {
    std::mutex out_mu;
    progress_throttle throttle(opt_.progress_interval);
    bool client_gone = false;
    const progress_fn progress = [&](std::string_view phase, std::uint64_t done,
                                     std::uint64_t total) {
      try {
        std::lock_guard lk(out_mu);
        if (client_gone || !throttle.admit(phase, done, total)) return;
        const int err = send_all(fd, progress_line(phase, done, total), /*drop_if_busy=*/true);
        if (err != 0 && err != EAGAIN) client_gone = true;  // keep working, stop writing
      } catch (...) {  // progress must not throw into the operation
      }
    };
    const auto start = clock::now();
    try {
      const nlohmann::json request = parse_request_line(line);
      op = op_of(request);
      final = result_line(handler_(request, progress));
      const double s = std::chrono::duration<double>(clock::now() - start).count();
      // The frequent read-only ones (monitoring polls status) would flood the log.
      if (op != "ls" && op != "stat" && op != "status") {
        char secs[32];
        std::snprintf(secs, sizeof secs, "%.2f", s);
        log_info("control: " + op + " done in " + secs + " s");
      }
    } catch (...) {
      const error_reply e = error_reply_of(std::current_exception());
      final = error_line(e.message, e.err);
      log_info("control: " + op + " failed: " + e.message);
    }
    if (opt_.before_reply) {
      try {
        opt_.before_reply();
      } catch (...) {
      }
    }
    std::lock_guard lk(out_mu);
    if (client_gone) final.clear();
  }
  if (!final.empty()) send_all(fd, final);
}

}  // namespace ckpt::fs::admin
