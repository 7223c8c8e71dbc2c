#pragma once
// The daemon's end of the control channel (control_protocol.hpp): listens on STORE/control.sock
// while the mount is up and runs each request through a handler (admin_service::handle in the
// daemon, a fake in unit tests), streaming its progress and then its result or error.
//
// Contracts:
// - One thread accepts; each connection is served on a thread of its own (requests may run for
//   minutes: verify --deep, prune of many versions), at most `max_connections` at once (more are
//   answered EBUSY at once).
// - A connection carries one request line (≤ max_request_bytes, within request_timeout of
//   connecting), then the answer; the server closes it after the final line.
// - The handler's exceptions become the error line (error_reply_of); nothing a client sends or
//   a request throws can take the daemon down. Writes use MSG_NOSIGNAL: a client that went away
//   mid-operation costs nothing but the rest of its output (the operation still completes, so a
//   prune is never left half-done because ckptctl was interrupted).
// - Progress reaches the client at most ~10 times a second (progress_throttle), and is dropped
//   rather than blocking the operation when the client does not read.
// - Peers must run as the daemon's user or root (SO_PEERCRED), on top of the socket's 0600.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "fs/admin/admin_service.hpp"
#include "fs/admin/control_protocol.hpp"

namespace ckpt::fs::admin {

class control_server {
 public:
  using handler_fn = std::function<nlohmann::json(const nlohmann::json&, const progress_fn&)>;

  struct options {
    std::size_t max_connections = 16;
    std::chrono::milliseconds request_timeout{30000};  // to receive the request line
    std::chrono::milliseconds progress_interval{100};
    std::chrono::milliseconds send_timeout{30000};  // a final line the client does not read
    // Called after the handler returned and before the final line is sent, on the connection's
    // thread; the daemon waits here until the kernel has dropped the names the request removed,
    // so the client's next `ls` cannot see them. Must not throw.
    std::function<void()> before_reply;
  };

  // Binds and listens on `socket_path` (removing a stale socket), then starts accepting.
  // Throws ckpt::io_error if the socket cannot be created.
  control_server(std::string socket_path, handler_fn handler, options opt);
  control_server(std::string socket_path, handler_fn handler)
      : control_server(std::move(socket_path), std::move(handler), options{}) {}
  // stop_accepting(), then waits for the requests in flight to finish and answer.
  ~control_server();
  control_server(const control_server&) = delete;
  control_server& operator=(const control_server&) = delete;

  // No new connections from now on: closes and unlinks the socket; connections still waiting
  // for their request line are closed. Requests already running continue. Idempotent.
  void stop_accepting();

  const std::string& socket_path() const { return path_; }

 private:
  struct connection {
    unique_fd fd;
    std::atomic<bool> done{false};
    std::jthread thread;
  };
  void accept_loop();
  void admit(unique_fd fd);  // checks the peer, starts the connection's thread
  void serve(connection& c);
  void serve_request(int fd);
  void reap(bool all);  // joins finished connection threads (all: every one)
  // Reads one request line; false when the client went away, timed out or we are stopping.
  bool read_request(int fd, std::string& line);

  std::string path_;
  handler_fn handler_;
  options opt_;
  unique_fd listen_fd_;
  unique_fd wake_fd_;  // eventfd: wakes the accept loop and connections waiting for a request
  std::atomic<bool> stopping_{false};
  std::mutex mu_;  // conns_, stop_accepting()
  std::list<std::unique_ptr<connection>> conns_;
  std::jthread acceptor_;  // last: started once everything above exists
};

}  // namespace ckpt::fs::admin
