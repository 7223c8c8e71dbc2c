// torch_zip_walker (torch_stream.hpp): data.pkl, then the storage records as they arrive.
#include "codec/format/torch_stream.hpp"

#include <algorithm>
#include <numeric>
#include <string_view>

#include "codec/error.hpp"
#include "codec/format/zip_records.hpp"

namespace ckpt::format {

using namespace zip_records;

namespace {

constexpr std::string_view pkl_suffix = "/data.pkl";
constexpr std::uint64_t max_small_record = 64u << 10;  // version, byteorder, ...

struct local_header {
  std::uint16_t flags = 0, method = 0;
  std::uint64_t size = 0;  // from the header; only meaningful without a descriptor
  std::string name;
  std::uint64_t data = 0;  // offset of the record's data
};

// The local header at `at`, or nothing if a central directory header starts there.
std::optional<local_header> read_local(const source& src, std::uint64_t at) {
  const auto h = read_some(src, at, 30);
  if (h.size() < 30) throw corrupt_error("torch stream: archive cut short");
  const auto sig = load<std::uint32_t>(h.data());
  if (sig == sig_central) return std::nullopt;
  if (sig != sig_local) throw corrupt_error("torch stream: expected a local header");
  local_header l;
  l.flags = load<std::uint16_t>(h.data() + 6);
  l.method = load<std::uint16_t>(h.data() + 8);
  l.size = load<std::uint32_t>(h.data() + 18);
  const auto name_len = load<std::uint16_t>(h.data() + 26);
  const auto extra_len = load<std::uint16_t>(h.data() + 28);
  const auto name = src.read(at + 30, name_len);
  l.name.assign(reinterpret_cast<const char*>(name.data()), name.size());
  l.data = at + 30 + name_len + extra_len;
  if (!(l.flags & flag_descriptor) && l.size == 0xffffffffu)
    throw corrupt_error("torch stream: zip64 sizes in a local header");
  return l;
}

}  // namespace

torch_zip_walker::torch_zip_walker(const source& src, const recognise_options& opt)
    : src_(src), opt_(opt) {
  const auto first = read_local(src_, 0);
  if (!first || !first->name.ends_with(pkl_suffix))
    throw corrupt_error("torch stream: data.pkl is not the first record");
  prefix_ = first->name.substr(0, first->name.size() - pkl_suffix.size() + 1);  // "archive/"
  if (prefix_.size() < 2 || prefix_.find('/') != prefix_.size() - 1)
    throw corrupt_error("torch stream: odd archive prefix");
  if (first->method != 0) throw corrupt_error("torch stream: data.pkl is compressed");
  std::uint64_t size = first->size, desc = 0;
  if (first->flags & flag_descriptor)
    std::tie(size, desc) = search_descriptor(src_, first->data, opt_.pickle.max_bytes);
  if (size > opt_.pickle.max_bytes) throw corrupt_error("torch stream: data.pkl too large");
  const auto scan = scan_torch_pickle(src_.read(first->data, size), opt_.pickle);
  at_ = first->data + size + desc;
  records_ = 1;

  // As recognise_torch makes them, in the order data.pkl names them.
  for (const auto& s : scan.storages) {
    const auto type = storage_element(s.type_name);
    // recognise_torch keeps such a record opaque; the walk could not tell where it ends (its
    // element size is unknown) and would stop in the middle of the file.
    if (!type) throw corrupt_error("torch stream: a storage of unknown type " + s.type_name);
    tensor_info t;
    t.name = s.names.empty() ? "data/" + s.key : s.names.front();
    if (s.names.size() > 1) t.aliases.assign(s.names.begin() + 1, s.names.end());
    t.type = *type;
    t.shape = s.shape.empty() ? std::vector<std::uint64_t>{s.numel} : s.shape;
    if (s.numel > ~std::uint64_t(0) / element_size(*type))
      throw corrupt_error("torch stream: storage too large");
    t.length = s.numel * element_size(*type);
    t.compress = is_candidate(t.type, t.length, opt_);
    predicted_.push_back(std::move(t));
    keys_.push_back("data/" + s.key);
    if (!by_key_.emplace(keys_.back(), keys_.size() - 1).second)
      throw corrupt_error("torch stream: data.pkl names a storage twice");
  }
  found_.assign(predicted_.size(), false);
  remaining_ = predicted_.size();
}

std::uint64_t torch_zip_walker::predicted_bytes(bool compress) const noexcept {
  std::uint64_t n = 0;
  for (const auto& t : predicted_)
    if (t.compress == compress) n += t.length;
  return n;
}

std::vector<std::size_t> torch_zip_walker::record_order() const {
  std::vector<std::size_t> order(predicted_.size());
  std::iota(order.begin(), order.end(), std::size_t(0));
  if (!format_version_)
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return keys_[a] < keys_[b]; });
  return order;
}

std::optional<std::size_t> torch_zip_walker::next() {
  while (remaining_ > 0) {
    if (descriptor_due_) {
      const std::uint64_t n = descriptor_at(src_, at_ - due_size_, due_size_);
      if (!n) throw corrupt_error("torch stream: no descriptor after a storage record");
      at_ += n;
      descriptor_due_ = false;
    }
    const auto l = read_local(src_, at_);
    if (!l) return std::nullopt;  // the central directory: records the pickle named are missing
    if (++records_ > opt_.zip.max_entries) throw corrupt_error("torch stream: too many records");
    if (!l->name.starts_with(prefix_))
      throw corrupt_error("torch stream: a record outside the archive's prefix");
    const std::string_view rest = std::string_view(l->name).substr(prefix_.size());
    const auto it = by_key_.find(std::string(rest));
    std::uint64_t size = l->size, desc = 0;
    if (it != by_key_.end()) {
      const std::size_t k = it->second;
      if (found_[k]) throw corrupt_error("torch stream: a storage record twice");
      if (l->method != 0) throw corrupt_error("torch stream: a compressed storage record");
      size = predicted_[k].length;
      if (!(l->flags & flag_descriptor) && l->size != size)
        throw corrupt_error("torch stream: a storage record's size disagrees with data.pkl");
      // The descriptor after the data is not read now, which would wait for the whole record,
      // but when the walk goes on (the top of this loop).
      found_[k] = true;
      --remaining_;
      predicted_[k].offset = l->data;
      at_ = l->data + size;
      descriptor_due_ = (l->flags & flag_descriptor) != 0;
      due_size_ = size;
      return k;
    }
    if (l->flags & flag_descriptor)
      std::tie(size, desc) = search_descriptor(src_, l->data, max_small_record);
    if (rest == ".format_version" && remaining_ == predicted_.size()) format_version_ = true;
    if (rest == "byteorder") {
      const auto b = src_.read(l->data, std::min<std::uint64_t>(size, 16));
      if (std::string_view(reinterpret_cast<const char*>(b.data()), b.size()) != "little")
        throw corrupt_error("torch stream: big-endian payloads are kept opaque");
    }
    at_ = l->data + size + desc;
  }
  return std::nullopt;
}

}  // namespace ckpt::format
