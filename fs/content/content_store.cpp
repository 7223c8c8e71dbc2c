// The content store's construction and small public helpers. Where the rest lives:
// content_impl.hpp (the map of fs/content).
#include "fs/content/content_store.hpp"

#include <array>

#include "codec/error.hpp"
#include "codec/scratch.hpp"
#include "fs/content/content_impl.hpp"

namespace ckpt::fs {

using nlohmann::json;

content_store::impl::impl(store::object_store& o, store::journal& j, content_options op)
    : objects(o),
      journal(j),
      opt(op),
      cache(op.cache_bytes - std::min(op.cache_bytes, chunk_budget(op.cache_bytes))),
      chunk_pool(std::make_shared<buffer_pool>(
          kChunkBlocks * codec::default_block_bytes,
          chunk_budget(op.cache_bytes) / (kChunkBlocks * codec::default_block_bytes) +
              prefetch_workers() + 4)),
      chunks(chunk_budget(op.cache_bytes)),
      slots(encode_slots::count_for(unsigned(usable_cores())), kSlabBytes),
      base_ahead(2, kSlabBytes) {
  if (!opt.heads_dir.empty()) {
    try {
      heads = std::make_unique<head_store>(opt.heads_dir);
    } catch (const std::exception& e) {
      heads_error = e.what();  // logged once a logger is set; restores decode the chains
    }
  }
  for (std::size_t i = 0, n = prefetch_workers(); i < n; ++i)
    prefetchers.emplace_back([this](std::stop_token stop) { prefetch_loop(stop); });
}

content_store::impl::~impl() {
  if (heads) heads->stop();
  for (auto& t : prefetchers) t.request_stop();
  prefetch_cv.notify_all();
  prefetchers.clear();  // joins
}

void content_store::impl::charge_coding() {
  std::lock_guard lock(charge_mu);
  const std::uint64_t held =
      slots.resident_bytes() + base_ahead.resident_bytes() + codec::scratch_bytes();
  const std::uint64_t over = held > kCodingAllowance ? held - kCodingAllowance : 0;
  cache.reserve(over);  // also when unchanged: values pinned at the last charge may be done
}

content_store::content_store(store::object_store& objects, store::journal& journal,
                             content_options opt)
    : impl_(std::make_unique<impl>(objects, journal, opt)) {
  if (opt.bits < 1 || opt.bits > codec::max_bits) throw invalid_argument("bits must be 1..4");
  if (opt.keyframe_bits < 0 || opt.keyframe_bits > 23)
    throw invalid_argument("keyframe_bits must be 1..23 (0: exact)");
  if (opt.ratio_bits < 0 || opt.ratio_bits > codec::max_bits)
    throw invalid_argument("ratio_bits must be 1..4 (0: bits)");
  if (opt.keyframe_interval < 0) throw invalid_argument("keyframe_interval must be >= 1 (0: auto)");
  if (opt.refresh_interval < 0) throw invalid_argument("refresh_interval must be >= 0");
  if (opt.moment_bits < 0 || opt.moment_bits > 23)
    throw invalid_argument("moment_bits must be 1..23 (0: keyframe_bits)");
}

content_store::~content_store() = default;

bool is_optimizer_state(std::string_view name) noexcept {
  static constexpr std::array<std::string_view, 7> buffers = {
      "exp_avg",    "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer",
      "square_avg", "acc_delta",  "exp_inf"};
  static constexpr std::array<std::string_view, 5> roots = {
      "optimizer", "optim", "optimizer_state", "optimizer_states", "optimizer_state_dict"};
  const auto dot = name.find('.');
  const std::string_view first = name.substr(0, dot);
  for (auto r : roots)
    if (first == r) return true;
  const auto last_dot = name.rfind('.');
  const std::string_view last =
      last_dot == std::string_view::npos ? name : name.substr(last_dot + 1);
  for (auto b : buffers)
    if (last == b) return true;
  return false;
}

bool is_second_moment(std::string_view name) noexcept {
  const auto last_dot = name.rfind('.');
  const std::string_view last =
      last_dot == std::string_view::npos ? name : name.substr(last_dot + 1);
  return last == "exp_avg_sq" || last == "max_exp_avg_sq" || last == "square_avg";
}

bool is_first_moment(std::string_view name) noexcept {
  const auto last_dot = name.rfind('.');
  const std::string_view last =
      last_dot == std::string_view::npos ? name : name.substr(last_dot + 1);
  return last == "exp_avg";
}

bool is_position_name(std::string_view name) noexcept {
  if (!name.starts_with("item")) return false;
  std::size_t i = 4;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
  return i > 4 && i < name.size() && name[i] == '/';
}

std::string tensor_class(std::string_view name) {
  const auto last_dot = name.rfind('.');
  const std::string_view last =
      last_dot == std::string_view::npos ? name : name.substr(last_dot + 1);
  if (last == "exp_avg" || last == "exp_avg_sq") return std::string(last);
  return is_optimizer_state(name) ? "optimizer (other)" : "weights";
}

std::string to_json(const version_info& i) {
  return json{
      {"version", i.version},           {"format", i.format}, {"kind", i.kind},
      {"lineage", i.lineage},           {"base", i.base},     {"logical_bytes", i.logical_bytes},
      {"stored_bytes", i.stored_bytes}, {"path", i.path},     {"donors", i.donors}}
      .dump();
}

void content_store::drop_caches() {
  impl_->cache.clear();
  impl_->chunks.clear();
}

void content_store::wait_heads() {
  if (impl_->heads) impl_->heads->wait_published();
}

void content_store::discard_head(std::uint64_t version) {
  if (impl_->heads) impl_->heads->drop(version);
}

void content_store::set_logger(log_sink log) {
  if (!impl_->heads_error.empty())
    log(log_level::error,
        "head images are off: " + impl_->heads_error + "; restores decode the chains");
  impl_->log = log;
  if (impl_->heads) impl_->heads->set_log(std::move(log));
}

content_store::resources content_store::usage() const {
  resources r;
  impl_->charge_coding();
  r.scratch_bytes = codec::scratch_bytes();
  r.scratch_threads = codec::scratch_threads();
  r.coding_charged = impl_->cache.reserved();
  r.cache_bytes = impl_->cache.bytes();
  r.cache_budget = impl_->cache.budget();
  r.chunk_bytes = impl_->chunks.bytes();
  r.chunk_budget = impl_->chunks.budget();
  r.encode_slots = impl_->slots.count();
  r.encodes_running = impl_->slots.in_use();
  r.encode_memory = impl_->slots.resident_bytes() + impl_->base_ahead.resident_bytes();
  if (impl_->heads) {
    const auto h = impl_->heads->stat();
    r.heads = h.images;
    r.heads_on_disk = h.published;
    r.head_memory = h.memory_bytes;
    r.head_disk_bytes = h.disk_bytes;
    r.heads_retired = h.retired;
    r.head_retired_bytes = h.retired_disk_bytes;
    r.head_retirements = h.retirements;
    r.head_retire_refused = h.retire_refused;
    r.saves_without_image = impl_->saves_without_image.load();
  }
  r.streams_running = impl_->streams_running.load();
  r.streamed_puts = impl_->streamed_puts.load();
  r.streams_dropped = impl_->streams_dropped.load();
  r.streams_declined = impl_->streams_declined.load();
  r.large_saves = impl_->large_saves.load();
  r.streams_not_kept = impl_->streams_not_kept.load();
  r.streams_kept_bytes = impl_->streams_kept_bytes.load();
  r.kept_in_place_bytes = impl_->kept_in_place_bytes.load();
  {
    std::lock_guard lock(impl_->declined_mu);
    r.last_declined = impl_->last_declined;
  }
  r.streamed_bytes = impl_->streamed_bytes.load();
  const decode_tally::counts d = impl_->decodes.get();
  r.chunks_decoded = d.chunks;
  r.chunk_bytes_decoded = d.chunk_bytes;
  r.chunks_decoded_again = d.again;
  r.chunk_bytes_decoded_again = d.again_bytes;
  r.stray_blocks_decoded = d.strays;
  r.stray_bytes_decoded = d.stray_bytes;
  r.chunk_frames_decoded = d.frames;
  r.read_ahead_jobs = impl_->prefetch_jobs.load();
  return r;
}

}  // namespace ckpt::fs
