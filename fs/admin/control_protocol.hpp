#pragma once
// The control channel between `ckptctl` and a live daemon (docs/management.md, "Protocol").
//
// Transport: a UNIX stream socket STORE/control.sock (mode 0600), one request per connection.
// Framing: newline-delimited JSON, each message one line of compact JSON (JSON strings escape
// newlines, so a line is always one whole message).
//   client -> server   one request object line, e.g. {"op":"verify","deep":true}
//   server -> client   zero or more {"progress":{"phase":s,"done":n,"total":n}} lines, then
//                      exactly one final line: {"ok":true,"result":{...}} or
//                      {"ok":false,"error":"message","errno":n}; then the server closes.
// The request and result objects are admin_service's (fs/admin/admin_service.hpp): ls, stat,
// rm, prune, verify, gc and export work on the store (also offline, in-process); status
// ({"op":"status"}, no fields) answers what the running daemon holds right now: its memory
// budget and VmRSS/VmHWM, cache, write buffers in memory and spilled, commits queued and
// running, encode slots, head images, the scratch directory. Only a daemon answers status (the
// offline service refuses it with ENOTCONN): the numbers exist only in a live process.
//
// This header holds what both ends share: message encoding and parsing, a line splitter, the
// progress rate limiter, the exception -> (message, errno) mapping, and the socket plumbing
// (owning fd, connect/listen with long paths, full sends without SIGPIPE). No FUSE here.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "codec/error.hpp"
#include "fs/store/posix.hpp"

namespace ckpt::fs::admin {

// STORE/control.sock
inline constexpr std::string_view control_socket_name = "control.sock";
std::string control_socket_path(std::string_view store_dir);

// A request line longer than this is refused (requests are small: a few paths).
inline constexpr std::size_t max_request_bytes = std::size_t(1) << 20;
// A response line longer than this is refused by the client (an `ls` of a huge store is a few
// MiB; this only stops a runaway peer from eating the client's memory).
inline constexpr std::size_t max_response_bytes = std::size_t(1) << 30;

// ---- messages ----------------------------------------------------------------------------------

// Each returns one line including its trailing '\n'.
std::string progress_line(std::string_view phase, std::uint64_t done, std::uint64_t total);
std::string result_line(const nlohmann::json& result);
std::string error_line(std::string_view message, int err);

// One server -> client line, parsed.
struct response {
  enum class kind { progress, result, error };
  kind type = kind::result;
  // progress
  std::string phase;
  std::uint64_t done = 0, total = 0;
  // result
  nlohmann::json result;
  // error
  std::string message;
  int err = 0;
};

// Throws ckpt::io_error(EPROTO) when the line is not a well-formed response (malformed JSON, an
// object that is none of the three messages, fields of the wrong type).
response parse_response_line(std::string_view line);

// A request line (without its '\n') -> the request object. Throws ckpt::invalid_argument when it
// is not a JSON object with a string "op".
nlohmann::json parse_request_line(std::string_view line);

// The final error line for an exception thrown by a request: ckpt::io_error keeps its errno,
// ckpt::invalid_argument and JSON type/range errors (a request field of the wrong type) are
// EINVAL, std::bad_alloc ENOMEM, anything else EIO. Never throws.
struct error_reply {
  std::string message;
  int err = 0;
};
error_reply error_reply_of(std::exception_ptr e) noexcept;

// ---- line splitting ----------------------------------------------------------------------------

// Accumulates bytes from a stream and hands out complete lines (without the '\n').
class line_splitter {
 public:
  explicit line_splitter(std::size_t max_line) : max_line_(max_line) {}
  void append(std::string_view bytes) { buf_.append(bytes); }
  // The next complete line, if any. Throws ckpt::io_error(EMSGSIZE) when more than max_line bytes
  // arrived without a newline.
  std::optional<std::string> next();
  // Bytes received after the last complete line.
  std::size_t pending() const { return buf_.size() - start_; }

 private:
  std::size_t max_line_;
  std::string buf_;
  std::size_t start_ = 0;  // consumed prefix of buf_ (compacted lazily)
};

// ---- progress rate limiting --------------------------------------------------------------------

// Decides which progress reports go on the wire: at most one per `interval` within a phase, but
// always the first report of a new phase and the report that completes it (done >= total), so a
// client's bar starts and ends where the server's does. Not thread-safe (callers lock).
class progress_throttle {
 public:
  using clock = std::chrono::steady_clock;
  explicit progress_throttle(std::chrono::milliseconds interval = std::chrono::milliseconds(100))
      : interval_(interval) {}
  bool admit(std::string_view phase, std::uint64_t done, std::uint64_t total,
             clock::time_point now = clock::now());

 private:
  std::chrono::milliseconds interval_;
  std::string phase_;
  bool any_ = false;
  bool completed_ = false;  // the completing report of phase_ was sent
  clock::time_point last_{};
};

// ---- sockets -----------------------------------------------------------------------------------

// The store's fd owner (fs/store/posix.hpp).
using unique_fd = store::detail::unique_fd;

// A listening socket at `path` (mode 0600: only the daemon's user, normally root, may manage the
// store). An existing file at `path` is removed first: the caller holds the store lock, so any
// socket there is a dead daemon's. Paths longer than sun_path are bound through
// /proc/self/fd/<dir>. Throws ckpt::io_error.
unique_fd listen_unix(const std::string& path, int backlog = 16);
// A connected socket. Throws ckpt::io_error with the connect errno (ENOENT: no socket,
// ECONNREFUSED: nobody listening).
unique_fd connect_unix(const std::string& path);

// Sends all of `data` (MSG_NOSIGNAL: a vanished peer is EPIPE, never SIGPIPE). Returns 0 or the
// errno. With `drop_if_busy`, returns EAGAIN without sending anything when the socket buffer is
// full (progress lines are optional); once a line is started it is always finished.
int send_all(int fd, std::string_view data, bool drop_if_busy = false) noexcept;

// ---- client ------------------------------------------------------------------------------------

// Called for each progress line the server sends.
using progress_callback =
    std::function<void(std::string_view phase, std::uint64_t done, std::uint64_t total)>;

// An {"ok":false} answer: the daemon ran the request and it failed (its errno and message).
class remote_error : public io_error {
 public:
  using io_error::io_error;
};

// Sends `request` on the socket at `socket_path` and waits for the final line; returns the
// result object. Throws remote_error for an error answer, ckpt::io_error for transport problems
// (cannot connect, the daemon closed the connection without answering, EPROTO for a malformed
// line).
nlohmann::json control_call(const std::string& socket_path, const nlohmann::json& request,
                            const progress_callback& progress = {});

}  // namespace ckpt::fs::admin
