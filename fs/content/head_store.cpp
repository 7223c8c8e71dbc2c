#include "fs/content/head_store.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include "codec/error.hpp"
#include "fs/store/posix.hpp"

namespace ckpt::fs {

using store::detail::pread_full;
using store::detail::throw_errno;
using store::detail::unique_fd;

namespace {

// A published image found in the heads directory at startup: read-only bytes of a file.
class file_bytes final : public staged_file {
 public:
  file_bytes(unique_fd fd, std::uint64_t size) : fd_(std::move(fd)), size_(size) {}
  std::uint64_t size() const override { return size_; }
  void read_fully(std::uint64_t offset, std::span<std::byte> out) const override {
    if (pread_full(fd_.get(), out, offset, "read head image") != out.size())
      throw io_error(EIO, "head image shorter than its size");
  }
  void overwrite(std::uint64_t, std::span<const std::byte>) override {
    throw io_error(EROFS, "a published head image is not rewritten");
  }
  bool modified() const override { return false; }
  int backing_file() override { return fd_.get(); }
  void copy_memory_to_file() const override {}
  void drop_memory() override {}
  std::uint64_t memory_bytes() const override { return 0; }

 private:
  unique_fd fd_;
  std::uint64_t size_;
};

bool parse_name(const char* name, std::uint64_t& version, std::uint64_t& checksum) {
  char tail[8] = {};
  return std::sscanf(name, "%16" SCNx64 "-%16" SCNx64 "%7s", &version, &checksum, tail) == 3 &&
         std::string_view(tail) == ".head" && std::strlen(name) == 16 + 1 + 16 + 5;
}

// Gives the nameless (O_TMPFILE) file `fd` the name `name` in `dir_fd`, replacing a file of that
// name. False, with errno set, when the kernel refuses (another filesystem, a named file).
bool link_unnamed(int dir_fd, int fd, const std::string& name) {
  ::unlinkat(dir_fd, name.c_str(), 0);
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  return ::linkat(AT_FDCWD, proc.c_str(), dir_fd, name.c_str(), AT_SYMLINK_FOLLOW) == 0;
}

}  // namespace

// ---- head_image ----------------------------------------------------------------------------

head_image::head_image(std::uint64_t version, std::uint64_t checksum,
                       std::shared_ptr<staged_file> bytes)
    : version_(version), checksum_(checksum), size_(bytes->size()), bytes_(std::move(bytes)) {}

void head_image::read(std::uint64_t offset, std::span<std::byte> out) const {
  if (!read_kept(offset, out))
    throw io_error(
        EIO, "head image of version " + std::to_string(version_) + ": a read of bytes it released");
}

bool head_image::read_kept(std::uint64_t offset, std::span<std::byte> out) const {
  std::shared_lock lock(mu_);
  if (overlaps_released(offset, out.size())) return false;
  bytes_->read_fully(offset, out);
  return true;
}

namespace {
// Holes are punched in whole blocks: ext4's and xfs's 4 KiB (a smaller block leaves a little more).
constexpr std::uint64_t kBlock = 4096;
std::uint64_t up(std::uint64_t x) {
  return (x + kBlock - 1) / kBlock * kBlock;
}
}  // namespace

bool head_image::overlaps_released(std::uint64_t offset, std::uint64_t n) const {
  if (released_.empty() || n == 0) return false;
  auto it = released_.upper_bound(offset);  // the first range starting past offset
  if (it != released_.end() && it->first < offset + n) return true;
  return it != released_.begin() && std::prev(it)->second > offset;
}

std::pair<std::uint64_t, std::uint64_t> head_image::mark_released(std::uint64_t offset,
                                                                  std::uint64_t n) {
  if (n == 0) return {};
  std::unique_lock lock(mu_);  // no read in flight reads the range once it is marked
  if (fd_ < 0) return {};      // unpublished: its bytes are (partly) memory, not blocks
  auto [it, fresh] = released_.emplace(offset, offset + n);
  if (!fresh) it->second = std::max(it->second, offset + n);
  // Coalesced with its neighbours: a stream releases one slab after the other.
  if (it != released_.begin()) {
    auto before = std::prev(it);
    if (before->second >= it->first) {
      before->second = std::max(before->second, it->second);
      released_.erase(it);
      it = before;
    }
  }
  for (auto next = std::next(it); next != released_.end() && next->first <= it->second;
       next = released_.erase(next))
    it->second = std::max(it->second, next->second);
  // The whole blocks of the coalesced range not marked before: those that touch the new part
  // (the rest of it was marked with the ranges it grew from).
  const std::uint64_t first = std::max(up(it->first), offset / kBlock * kBlock);
  const std::uint64_t last =
      std::min(std::min(it->second, size_) / kBlock * kBlock, up(offset + n));
  if (last <= first) return {};
  return {first, last};
}

void head_image::punch(std::uint64_t first, std::uint64_t last) {
  // fd_ is set once, before the image was retired, and lives as long as the image.
  if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(first),
                  off_t(last - first)) != 0)
    punch_failed_ = true;  // the blocks stay; reads of the range are refused all the same
}

std::uint64_t head_image::released_bytes() const {
  std::shared_lock lock(mu_);
  if (punch_failed_) return 0;
  std::uint64_t n = 0;
  for (const auto& [start, end] : released_) {
    const std::uint64_t a = up(start), b = std::min(end, size_) / kBlock * kBlock;
    n += b > a ? b - a : 0;
  }
  return n;
}

int head_image::published_fd() const {
  std::shared_lock lock(mu_);
  return fd_;
}

std::uint64_t head_image::memory_bytes() const {
  std::shared_lock lock(mu_);
  return bytes_->memory_bytes();
}

bool head_image::publish(int dir_fd, const std::string& name, const std::function<bool()>& wanted) {
  if (!wanted()) return false;
  int fd;
  {
    std::unique_lock lock(mu_);
    fd = bytes_->backing_file();
  }
  {
    std::shared_lock lock(mu_);  // readers go on meanwhile: the memory is only read
    bytes_->copy_memory_to_file();
  }
  if (::fdatasync(fd) != 0) throw_errno(errno, "fdatasync of head image " + name);
  // A slow copy (a loaded disk) may outlast the image's drop: its name would show for a moment.
  if (!wanted()) return false;
  // The staging file has no name (O_TMPFILE): give it one in the heads directory. A file that
  // cannot be linked there (another filesystem, a staging file made without O_TMPFILE) is
  // copied instead.
  if (!link_unnamed(dir_fd, fd, name)) {
    const std::string tmp = name + ".tmp";
    unique_fd out(::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!out) throw_errno(errno, "cannot create head image " + tmp);
    loff_t in_off = 0, out_off = 0;
    while (std::uint64_t(in_off) < size_) {
      const ssize_t n = ::copy_file_range(fd, &in_off, out.get(), &out_off,
                                          std::size_t(size_ - std::uint64_t(in_off)), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int e = n < 0 ? errno : EIO;
        ::unlinkat(dir_fd, tmp.c_str(), 0);
        throw_errno(e, "copy of head image " + name);
      }
    }
    if (::fdatasync(out.get()) != 0 || ::renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) {
      const int e = errno;
      ::unlinkat(dir_fd, tmp.c_str(), 0);
      throw_errno(e, "head image " + name);
    }
  }
  std::unique_lock lock(mu_);
  bytes_->drop_memory();
  fd_ = fd;
  return true;
}

// ---- head_store ----------------------------------------------------------------------------

head_store::head_store(std::string dir) : dir_(std::move(dir)) {
  if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST)
    throw_errno(errno, "cannot create the heads directory " + dir_);
  dir_fd_ = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd_ < 0) throw_errno(errno, "cannot open the heads directory " + dir_);
  try {
    releaser_ = std::jthread([this](std::stop_token stop) { releaser(stop); });
    worker_ = std::jthread([this](std::stop_token stop) { worker(stop); });
  } catch (...) {  // a started thread is stopped and joined by its jthread member
    ::close(dir_fd_);
    throw;
  }
}

head_store::~head_store() {
  stop();
  ::close(dir_fd_);
}

void head_store::stop() noexcept {
  worker_.request_stop();
  releaser_.request_stop();
  cv_.notify_all();
  // Both finish what is queued first (a stopped wait still returns its predicate); rebuilds
  // stop at their next piece. What their jobs and images hold is let go on these threads,
  // while every member lives: a job's reader, let go, may call drop().
  if (worker_.joinable()) worker_.join();
  if (releaser_.joinable()) releaser_.join();
}

std::string head_store::file_name(std::uint64_t version, std::uint64_t checksum) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%016" PRIx64 "-%016" PRIx64 ".head", version, checksum);
  return buf;
}

void head_store::scan(const std::map<std::uint64_t, expected>& heads) {
  std::vector<std::string> names;
  {
    int fd = ::openat(dir_fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) throw_errno(errno, "cannot read the heads directory " + dir_);
    DIR* d = ::fdopendir(fd);
    if (!d) {
      ::close(fd);
      throw_errno(errno, "cannot read the heads directory " + dir_);
    }
    while (dirent* e = ::readdir(d))
      if (std::string_view(e->d_name) != "." && std::string_view(e->d_name) != "..")
        names.emplace_back(e->d_name);
    ::closedir(d);
  }
  std::lock_guard lock(mu_);
  for (const auto& name : names) {
    std::uint64_t version = 0, checksum = 0;
    bool keep = false;
    if (parse_name(name.c_str(), version, checksum)) {
      auto it = heads.find(version);
      struct stat st;
      if (it != heads.end() && it->second.checksum == checksum &&
          ::fstatat(dir_fd_, name.c_str(), &st, 0) == 0 &&
          std::uint64_t(st.st_size) == it->second.size) {
        unique_fd fd(::openat(dir_fd_, name.c_str(), O_RDONLY | O_CLOEXEC));
        if (fd) {
          const int raw = fd.get();
          auto image = std::make_shared<head_image>(
              version, checksum, std::make_shared<file_bytes>(std::move(fd), it->second.size));
          image->fd_ = raw;
          images_[version] = std::move(image);
          wanted_.insert(version);
          keep = true;
        }
      }
    }
    if (!keep) ::unlinkat(dir_fd_, name.c_str(), 0);
  }
}

std::map<std::uint64_t, std::uint64_t> head_store::files_in(const std::string& dir) {
  std::map<std::uint64_t, std::uint64_t> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    std::uint64_t version = 0, checksum = 0;
    struct stat st;
    if (parse_name(e->d_name, version, checksum) && ::fstatat(::dirfd(d), e->d_name, &st, 0) == 0 &&
        S_ISREG(st.st_mode))
      out[version] = std::uint64_t(st.st_size);
  }
  ::closedir(d);
  return out;
}

std::shared_ptr<const head_image> head_store::get(std::uint64_t version) const {
  std::lock_guard lock(mu_);
  auto it = images_.find(version);
  return it == images_.end() ? nullptr : it->second;
}

void head_store::adopt(std::uint64_t version, std::uint64_t checksum,
                       std::shared_ptr<staged_file> bytes) {
  auto image = std::make_shared<head_image>(version, checksum, std::move(bytes));
  {
    std::lock_guard lock(mu_);
    wanted_.insert(version);
    images_[version] = image;
    to_publish_.push_back(std::move(image));
  }
  cv_.notify_all();
}

void head_store::rebuild(std::uint64_t version, std::uint64_t checksum, std::uint64_t size,
                         byte_reader read) {
  {
    std::lock_guard lock(mu_);
    to_rebuild_.push_back({version, checksum, size, std::move(read)});
    wanted_.insert(version);
  }
  cv_.notify_all();
}

void head_store::run_rebuild(rebuild_job& job) {
  const std::string name = file_name(job.version, job.checksum);
  unique_fd fd(::openat(dir_fd_, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (!fd) throw_errno(errno, "cannot create a head image in " + dir_);
  std::vector<std::byte> buf(std::size_t(16) << 20);
  for (std::uint64_t at = 0; at < job.size;) {
    {
      std::lock_guard lock(mu_);
      if (!wanted_.count(job.version) || worker_.get_stop_token().stop_requested()) return;
    }
    const std::size_t n = std::size_t(std::min<std::uint64_t>(buf.size(), job.size - at));
    job.read(at, std::span(buf).first(n));
    store::detail::pwrite_all(fd.get(), std::span(buf).first(n), at, "write head image " + name);
    at += n;
  }
  if (::fdatasync(fd.get()) != 0) throw_errno(errno, "fdatasync of head image " + name);
  const int raw = fd.get();
  auto image = std::make_shared<head_image>(job.version, job.checksum,
                                            std::make_shared<file_bytes>(std::move(fd), job.size));
  std::lock_guard lock(mu_);
  // Dropped meanwhile (the lineage moved on: drop() removed the job's version from `wanted`),
  // or a newer image adopted: this one is not needed.
  if (!wanted_.count(job.version) || images_.count(job.version)) return;
  if (!link_unnamed(dir_fd_, raw, name)) throw_errno(errno, "cannot link head image " + name);
  image->fd_ = raw;
  images_[job.version] = std::move(image);
}

void head_store::rechecksum(std::uint64_t version, std::uint64_t checksum) {
  std::lock_guard lock(mu_);
  for (auto& job : to_rebuild_)  // not started yet: built under the new name
    if (job.version == version) job.checksum = checksum;
  auto it = images_.find(version);
  if (it == images_.end()) return;
  head_image& image = *it->second;
  const std::uint64_t old = image.checksum_.exchange(checksum);
  // Unpublished: the worker names it with the new checksum (or renames what it just named).
  if (old == checksum || image.published_fd() < 0) return;
  if (::renameat(dir_fd_, file_name(version, old).c_str(), dir_fd_,
                 file_name(version, checksum).c_str()) != 0 &&
      errno != ENOENT && log_)
    log_(log_level::error,
         "head image of version " + std::to_string(version) +
             " not renamed after its rewrite (rebuilt after a restart): " + std::strerror(errno));
}

std::shared_ptr<head_image> head_store::retire(std::uint64_t version) {
  std::shared_ptr<head_image> image;
  {
    std::lock_guard lock(mu_);
    auto it = images_.find(version);
    // The map's reference the only one: no open file (filesystem handles hold their image), no
    // reader, no publication or rebuild holds it, and once it is out of the map none can start.
    if (it == images_.end()) return nullptr;
    // Waiting for its publication (not started): it need not be written at all, the save will
    // supersede it (or have it rebuilt). Its bytes stay where they are, nothing is released.
    const auto queued = std::find(to_publish_.begin(), to_publish_.end(), it->second);
    const long others = queued != to_publish_.end() ? 1 : 0;
    if (it->second.use_count() != 1 + others ||
        (it->second->published_fd() < 0 && queued == to_publish_.end())) {
      ++retire_refused_;
      return nullptr;
    }
    ++retirements_;
    image = std::move(it->second);
    images_.erase(it);
    if (queued != to_publish_.end()) to_publish_.erase(queued);
    std::erase_if(retired_, [](const std::weak_ptr<head_image>& w) { return w.expired(); });
    retired_.push_back(image);
  }
  if (image->published_fd() < 0) return image;  // no name, nothing will be punched
  // Its name goes first, durably: after a crash no name may point at an image with holes (the
  // version is rebuilt instead, as any head found without its image).
  const auto t0 = std::chrono::steady_clock::now();
  if ((::unlinkat(dir_fd_, file_name(version, image->checksum()).c_str(), 0) != 0 &&
       errno != ENOENT) ||
      ::fsync(dir_fd_) != 0) {
    const int e = errno;
    if (log_)
      log_(log_level::error, "head image of version " + std::to_string(version) +
                                 " kept beside the next save (its name could not be removed: " +
                                 std::strerror(e) + ")");
    // Nothing released from it: it serves its version as before (a name that did not go is
    // still right; one that went is made again after a restart, as for a crash).
    {
      std::lock_guard lock(mu_);
      // Compared by owner, not lock(): a temporary owner could be the last one, under mu_.
      std::erase_if(retired_, [&](const std::weak_ptr<head_image>& w) {
        return w.expired() || (!w.owner_before(image) && !image.owner_before(w));
      });
      --retirements_;
      ++retire_refused_;
      if (!images_.count(version) && wanted_.count(version))
        images_[version] = std::move(image);
      else  // dropped meanwhile
        to_release_.push_back(std::move(image));
    }
    cv_.notify_all();
    return nullptr;
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (took > 0.25 && log_)  // the directory's fsync waits for the file system's journal
    log_(log_level::info, "head image of version " + std::to_string(version) + " retired after " +
                              std::to_string(int(took * 1000)) + " ms (removing its name durably)");
  return image;
}

void head_store::release(const std::shared_ptr<head_image>& image, std::uint64_t offset,
                         std::uint64_t n) {
  const auto [first, last] = image->mark_released(offset, n);
  if (last <= first) return;
  {
    std::lock_guard lock(mu_);
    to_punch_.push_back({image, first, last});
  }
  cv_.notify_all();
}

bool head_store::unretire(std::shared_ptr<head_image> image) {
  const std::uint64_t version = image->version();
  bool orphan;
  {
    std::lock_guard lock(mu_);
    orphan = wanted_.count(version) && !images_.count(version) &&
             std::none_of(to_rebuild_.begin(), to_rebuild_.end(),
                          [&](const rebuild_job& j) { return j.version == version; });
    if (orphan && image->published_fd() < 0) {
      // Retired before its publication, so nothing was released from it: it is the head's
      // image again, published as it would have been.
      images_[version] = image;
      to_publish_.push_back(std::move(image));
      orphan = false;
    } else {
      to_release_.push_back(std::move(image));
    }
  }
  cv_.notify_all();
  return orphan;
}

void head_store::drop(std::uint64_t version) {
  std::shared_ptr<head_image> image;
  // Destroyed after mu_ is released: a job's reader lets go of its version's pin, which may
  // drop another image (content_store's unref rule), i.e. call this again.
  std::vector<rebuild_job> jobs;
  {
    std::lock_guard lock(mu_);
    wanted_.erase(version);
    for (auto it = to_rebuild_.begin(); it != to_rebuild_.end();) {
      if (it->version != version) {
        ++it;
        continue;
      }
      jobs.push_back(std::move(*it));
      it = to_rebuild_.erase(it);
    }
    auto it = images_.find(version);
    if (it == images_.end()) return;
    image = std::move(it->second);
    images_.erase(it);
    std::erase(to_publish_, image);
  }
  // A name the worker is creating right now is removed by the worker (it checks afterwards).
  if (image->published_fd() >= 0)
    ::unlinkat(dir_fd_, file_name(image->version(), image->checksum()).c_str(), 0);
  {
    std::lock_guard lock(mu_);
    to_release_.push_back(std::move(image));
  }
  cv_.notify_all();
}

void head_store::releaser(std::stop_token stop) {
  for (;;) {
    std::shared_ptr<head_image> image;
    punch_job job;
    {
      std::unique_lock lock(mu_);
      if (!cv_.wait(lock, stop, [&] { return !to_release_.empty() || !to_punch_.empty(); })) return;
      if (!to_punch_.empty()) {  // before the closes: a save waits for that space
        job = std::move(to_punch_.front());
        to_punch_.pop_front();
      } else {
        image = std::move(to_release_.front());
        to_release_.pop_front();
      }
      ++releasing_;
    }
    if (job.image) job.image->punch(job.first, job.last);
    job = {};
    image.reset();  // the close (and the freeing of its blocks) where it was the last reference
    {
      std::lock_guard lock(mu_);
      --releasing_;
    }
    cv_.notify_all();
  }
}

head_store::stats head_store::stat() const {
  // Retired images locked below may be the last reference by the time the lock goes (the
  // releaser lets go outside it): destroyed after the lock, never under it (an image's bytes
  // may hold a reader, whose pin let go may call drop()).
  std::vector<std::shared_ptr<head_image>> held;
  std::lock_guard lock(mu_);
  stats s;
  for (const auto& [v, image] : images_) {
    ++s.images;
    if (image->published_fd() >= 0) {
      ++s.published;
      s.disk_bytes += image->size();
    }
    s.memory_bytes += image->memory_bytes();
  }
  s.retirements = retirements_;
  s.retire_refused = retire_refused_;
  for (const auto& w : retired_)
    if (auto image = w.lock()) {
      ++s.retired;
      s.retired_disk_bytes += image->size() - std::min(image->size(), image->released_bytes());
      held.push_back(std::move(image));
    }
  return s;
}

void head_store::wait_published() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] {
    return to_publish_.empty() && to_rebuild_.empty() && publishing_ == 0 && to_release_.empty() &&
           to_punch_.empty() && releasing_ == 0;
  });
}

void head_store::worker(std::stop_token stop) {
  for (;;) {
    std::shared_ptr<head_image> image;
    std::optional<rebuild_job> job;
    {
      std::unique_lock lock(mu_);
      if (!cv_.wait(lock, stop, [&] { return !to_publish_.empty() || !to_rebuild_.empty(); }))
        return;
      ++publishing_;
      if (!to_publish_.empty()) {  // new heads first: they hold write-buffer memory
        image = std::move(to_publish_.front());
        to_publish_.pop_front();
      } else {
        job = std::move(to_rebuild_.front());
        to_rebuild_.pop_front();
      }
    }
    if (job) {
      try {
        run_rebuild(*job);
      } catch (const std::exception& e) {
        if (log_)
          log_(log_level::error,
               "head image of version " + std::to_string(job->version) +
                   " not rebuilt (its version decodes through its chain instead): " + e.what());
      }
      // Its reader (and the pin on its version) goes before the count drops, so that
      // wait_published() returns with what the job held let go, as for an image below.
      job.reset();
      {
        std::lock_guard lock(mu_);
        --publishing_;
      }
      cv_.notify_all();
      continue;
    }
    const std::uint64_t named = image->checksum();
    const std::string name = file_name(image->version(), named);
    bool failed = false;
    try {
      (void)image->publish(dir_fd_, name, [&] {
        std::lock_guard lock(mu_);
        const auto it = images_.find(image->version());
        return it != images_.end() && it->second == image;
      });
    } catch (const std::exception& e) {
      failed = true;
      if (log_)
        log_(log_level::error,
             "head image of version " + std::to_string(image->version()) +
                 " not kept (its version decodes through its chain instead): " + e.what());
    }
    {
      std::lock_guard lock(mu_);
      auto it = images_.find(image->version());
      const bool current = it != images_.end() && it->second == image;
      if (!current && image->published_fd() >= 0)
        ::unlinkat(dir_fd_, name.c_str(), 0);  // dropped or replaced while it was published
      else if (current && image->published_fd() >= 0 && image->checksum() != named)
        ::renameat(dir_fd_, name.c_str(), dir_fd_,  // rewritten (rechecksum) meanwhile
                   file_name(image->version(), image->checksum()).c_str());
      // An image that cannot go to disk is not kept in memory either: that memory is buffer=.
      if (failed && current) images_.erase(it);
    }
    // Ours may be the last reference (dropped meanwhile): released before the count drops, so
    // that wait_published() returns with dropped images released, whichever thread held them.
    image.reset();
    {
      std::lock_guard lock(mu_);
      --publishing_;
    }
    cv_.notify_all();
  }
}

}  // namespace ckpt::fs
