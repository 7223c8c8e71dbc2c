// distcp_walker (distcp_stream.hpp): a DCP shard's archives, walked one after the other as they
// are written, found and ended by the recogniser's own rules (distcp_archives.hpp).
#include "codec/format/distcp_stream.hpp"

#include "codec/error.hpp"
#include "codec/format/distcp_archives.hpp"

namespace ckpt::format {

distcp_walker::distcp_walker(const source& src, const recognise_options& opt)
    : src_(src), opt_(opt) {
  find_next(0);
}

distcp_walker::~distcp_walker() = default;

void distcp_walker::find_next(std::uint64_t from) {
  at_ = distcp::archive_starts_at(src_, from) ? std::optional(from)
                                              : distcp::find_archive(src_, from);
}

void distcp_walker::open_archive(std::uint64_t at) {
  slice_.emplace(src_.slice(at, src_.size() - at));
  try {
    walker_ = std::make_unique<torch_zip_walker>(*slice_, opt_);
    found_ = 0;
    return;
  } catch (const corrupt_error&) {
    // Not an archive it can follow from its start (the recogniser may still take it: then the
    // commit finds tensors the walk did not, and stores the file whole).
    slice_.reset();
  }
  try {
    find_next(distcp::archive_end(src_, at, opt_));
  } catch (const corrupt_error&) {
    at_.reset();  // where an archive cannot be ended, the rest of the shard is opaque
  }
}

void distcp_walker::close_archive() {
  if (found_ < walker_->predicted().size()) complete_ = false;
  walker_.reset();
  slice_.reset();
  const std::uint64_t at = *at_;
  at_.reset();  // a read that fails below (a cancelled stream) leaves the walk ended
  try {
    find_next(distcp::archive_end(src_, at, opt_));
  } catch (const corrupt_error&) {
    complete_ = false;  // the recogniser makes this archive opaque, with what was found in it
    at_.reset();
  }
}

std::optional<tensor_info> distcp_walker::next() {
  for (;;) {
    if (walker_) {
      std::optional<std::size_t> k;
      try {
        k = walker_->next();
      } catch (const corrupt_error&) {
        // A record that does not fit data.pkl's prediction: the recogniser cannot end this
        // archive either, and the rest is opaque.
        complete_ = false;
        walker_.reset();
        slice_.reset();
        at_.reset();
        return std::nullopt;
      }
      if (!k) {
        close_archive();
        continue;
      }
      ++found_;
      tensor_info t = walker_->predicted()[*k];
      t.offset += *at_;
      t.name = distcp::item_name(archives_ - 1, t.name);
      for (auto& alias : t.aliases) alias = distcp::item_name(archives_ - 1, alias);
      return t;
    }
    if (!at_) return std::nullopt;
    if (++archives_ > distcp::max_archives) {
      at_.reset();
      return std::nullopt;
    }
    open_archive(*at_);
  }
}

}  // namespace ckpt::format
