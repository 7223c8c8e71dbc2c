#include "fs/content/lineage_key.hpp"

#include "codec/xxh3.hpp"

#include <cctype>
#include <regex>

namespace ckpt::fs {

namespace {

// Kept: digits after a rank/shard word that starts a token ("rank_3", "mp_rank_03", "shard2",
// "tp-1"), "N-of-M" shard counters and DCP's "__R_S" file names. Everything else numeric is a
// step or an epoch ("step_500", "epoch=3", "checkpoint-500").
const std::regex& keep_pattern() {
  static const std::regex keep(
      R"((?:^|[^a-z])(?:rank|shard|part|tp|pp|dp|worker|node)[_-]?\d+|\d+-of-\d+|__\d+_\d+)",
      std::regex::icase);
  return keep;
}

}  // namespace

std::string lineage_rank_tokens(std::string_view path) {
  std::string s(path), out;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), keep_pattern());
       it != std::sregex_iterator(); ++it) {
    out += it->str();
    out += '\x1f';
  }
  return out;
}

std::string lineage_path_key(std::string_view path) {
  const std::regex& keep = keep_pattern();
  std::string out;
  std::string s(path);
  auto put_stripped = [&](const std::string& piece) {
    bool in_digits = false;
    for (char c : piece) {
      if (std::isdigit(static_cast<unsigned char>(c))) {
        if (!in_digits) out += '#';
        in_digits = true;
      } else {
        out += c;
        in_digits = false;
      }
    }
  };
  auto begin = std::sregex_iterator(s.begin(), s.end(), keep);
  std::size_t at = 0;
  for (auto it = begin; it != std::sregex_iterator(); ++it) {
    put_stripped(s.substr(at, std::size_t(it->position()) - at));
    out += it->str();
    at = std::size_t(it->position() + it->length());
  }
  put_stripped(s.substr(at));
  return out;
}

bool identifies(const format::tensor_info& t, bool has_large) noexcept {
  return t.compress && (t.length >= identity_min_bytes || !has_large);
}

bool has_large_tensor(std::span<const format::tensor_info> tensors) noexcept {
  for (const auto& t : tensors)
    if (t.compress && t.length >= identity_min_bytes) return true;
  return false;
}

std::uint64_t lineage_signature(const format::layout& l) {
  std::string sig;
  const bool large = has_large_tensor(l.tensors);
  for (const auto& t : l.tensors) {
    if (!identifies(t, large)) continue;
    sig += t.name;
    sig += '\x1f';
    sig += format::name(t.type);
    for (auto d : t.shape) sig += ',' + std::to_string(d);
    sig += '\x1e';
  }
  return sig.empty() ? 0 : XXH3_64bits(sig.data(), sig.size());
}

}  // namespace ckpt::fs
