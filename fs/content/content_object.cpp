#include "fs/content/content_object.hpp"

#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "codec/error.hpp"
#include "codec/xxh3.hpp"

namespace ckpt::fs {
namespace {

void put32(std::byte* p, std::uint32_t v) {
  std::memcpy(p, &v, 4);
}  // little-endian hosts
void put64(std::byte* p, std::uint64_t v) {
  std::memcpy(p, &v, 8);
}
std::uint32_t get32(const std::byte* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
std::uint64_t get64(const std::byte* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// The stored metadata checked against its checksum before anything reads it.
void check_sum(std::span<const std::byte> stored, std::uint64_t sum, const std::string& what) {
  if (XXH3_64bits(stored.data(), stored.size()) != sum)
    throw corrupt_error("content: metadata checksum mismatch in " + what);
}

}  // namespace

// Level 9: metadata is small (kilobytes to a few MiB for the largest shards' block indexes) and
// written once per version. On a language model's optimizer.pt (28 KB of CBOR) levels 3, 6, 9
// and 19 gave 9.9, 9.5, 9.5 and 8.4 KB.
constexpr int meta_zstd_level = 9;

namespace {
struct cctx_free {
  void operator()(ZSTD_CCtx* c) const noexcept { ZSTD_freeCCtx(c); }
};
struct dctx_free {
  void operator()(ZSTD_DCtx* c) const noexcept { ZSTD_freeDCtx(c); }
};
}  // namespace

std::vector<std::byte> compress_metadata(std::span<const std::byte> cbor,
                                         std::span<const std::byte> dictionary) {
  const std::unique_ptr<ZSTD_CCtx, cctx_free> c(ZSTD_createCCtx());
  if (!c) throw io_error(ENOMEM, "content: metadata compression failed");
  std::vector<std::byte> out(ZSTD_compressBound(cbor.size()));
  std::size_t n = ZSTD_CCtx_setParameter(c.get(), ZSTD_c_compressionLevel, meta_zstd_level);
  if (!ZSTD_isError(n) && !dictionary.empty())
    n = ZSTD_CCtx_refPrefix(c.get(), dictionary.data(), dictionary.size());
  if (!ZSTD_isError(n))
    n = ZSTD_compress2(c.get(), out.data(), out.size(), cbor.data(), cbor.size());
  if (ZSTD_isError(n)) throw io_error(ENOMEM, "content: metadata compression failed");
  out.resize(n);
  return out;
}

std::vector<std::byte> inflate_metadata(std::span<const std::byte> z, const std::string& what,
                                        std::uint64_t max_bytes,
                                        std::span<const std::byte> dictionary) {
  const unsigned long long n = ZSTD_getFrameContentSize(z.data(), z.size());
  if (n == ZSTD_CONTENTSIZE_UNKNOWN || n == ZSTD_CONTENTSIZE_ERROR || n > max_bytes)
    throw corrupt_error("content: bad metadata frame in " + what);
  const std::unique_ptr<ZSTD_DCtx, dctx_free> d(ZSTD_createDCtx());
  if (!d) throw io_error(ENOMEM, "content: metadata decompression failed");
  std::vector<std::byte> out(n);
  std::size_t got = 0;
  if (!dictionary.empty()) got = ZSTD_DCtx_refPrefix(d.get(), dictionary.data(), dictionary.size());
  if (!ZSTD_isError(got))
    got = ZSTD_decompressDCtx(d.get(), out.data(), out.size(), z.data(), z.size());
  if (ZSTD_isError(got) || got != n)
    throw corrupt_error("content: metadata does not decompress in " + what);
  return out;
}

content_object_writer::content_object_writer(store::object_store& objects, std::uint32_t format)
    : writer_(objects.begin()), format_(format) {
  if (format < 1 || format > content_format_version)
    throw invalid_argument("content object format " + std::to_string(format));
  if (format_ == 1) return;  // the prefix names the metadata: written at finish()
  std::byte prefix[content_prefix_size] = {};
  put32(prefix, content_magic);
  put32(prefix + 4, format_);
  writer_.append(prefix);
}

std::uint64_t content_object_writer::data_size() const noexcept {
  return format_ == 1 ? v1_data_.size() : writer_.size() - content_prefix_size;
}

void content_object_writer::append(std::span<const std::byte> bytes) {
  if (format_ == 1)
    v1_data_.insert(v1_data_.end(), bytes.begin(), bytes.end());
  else
    writer_.append(bytes);
}

store::object_ref content_object_writer::finish(const version_meta& meta,
                                                std::span<const std::byte> dictionary) {
  if (format_ < 4) dictionary = {};
  std::vector<std::byte> bytes = encode_meta(meta);
  if (format_ >= 3) bytes = compress_metadata(bytes, dictionary);
  const std::uint64_t sum = XXH3_64bits(bytes.data(), bytes.size());
  if (format_ == 1) {
    std::byte prefix[content_prefix_size];
    put32(prefix, content_magic);
    put32(prefix + 4, 1);
    put64(prefix + 8, bytes.size());
    put64(prefix + 16, sum);
    writer_.append(prefix);
    writer_.append(bytes);
    writer_.append(v1_data_);
    return writer_.commit();
  }
  std::byte trailer[content_trailer_v4_size] = {};
  put64(trailer, bytes.size());
  put64(trailer + 8, sum);
  std::size_t at = 16;
  if (format_ >= 4) {
    put64(trailer + 16, dictionary.size());
    put64(trailer + 24, dictionary.empty() ? 0 : XXH3_64bits(dictionary.data(), dictionary.size()));
    at = 32;
  }
  put32(trailer + at + 4, content_trailer_magic);
  writer_.append(bytes);
  writer_.append(std::span(trailer, at + 8));
  return writer_.commit();
}

content_header read_content_header(const store::object_store& objects, const store::object_ref& obj,
                                   const metadata_dictionary& dictionary) {
  const std::string what = "object " + std::to_string(obj.id);
  if (obj.size < content_prefix_size) throw corrupt_error("content: " + what + " is too short");
  std::byte prefix[content_prefix_size];
  objects.read(obj.id, 0, prefix);
  if (get32(prefix) != content_magic) throw corrupt_error("content: bad object magic in " + what);
  const std::uint32_t version = get32(prefix + 4);
  content_header h;
  if (version == 1) {
    const std::uint64_t len = get64(prefix + 8);
    if (len > obj.size - content_prefix_size) throw corrupt_error("content: meta length");
    std::vector<std::byte> meta(len);
    objects.read(obj.id, content_prefix_size, meta);
    check_sum(meta, get64(prefix + 16), what);
    h.meta = std::make_shared<const version_meta>(decode_meta(meta));
    h.data_base = content_prefix_size + len;
    h.data_bytes = obj.size - h.data_base;
    h.meta_bytes = len;
    return h;
  }
  if (version < 2 || version > 4)
    throw error(errc::unsupported, "content: object format " + std::to_string(version));
  if (get64(prefix + 8) != 0 || get64(prefix + 16) != 0)
    throw corrupt_error("content: reserved prefix bytes are not zero in " + what);
  const std::size_t trailer_size = version == 4 ? content_trailer_v4_size : content_trailer_size;
  if (obj.size < content_prefix_size + trailer_size)
    throw corrupt_error("content: " + what + " is too short");
  std::byte trailer[content_trailer_v4_size];
  objects.read(obj.id, obj.size - trailer_size, std::span(trailer, trailer_size));
  if (get32(trailer + trailer_size - 4) != content_trailer_magic ||
      get32(trailer + trailer_size - 8) != 0)
    throw corrupt_error("content: bad metadata trailer in " + what);
  const std::uint64_t len = get64(trailer);
  if (len > obj.size - content_prefix_size - trailer_size)
    throw corrupt_error("content: meta length");
  std::vector<std::byte> meta(len);
  objects.read(obj.id, obj.size - trailer_size - len, meta);
  check_sum(meta, get64(trailer + 8), what);
  std::span<const std::byte> dict;
  if (version == 4 && get64(trailer + 16) != 0) {
    // The base's inline exact bytes, which the version needs anyway; checked, so that a wrong
    // one is damage named as such, not garbage CBOR.
    if (!dictionary) throw corrupt_error("content: no metadata dictionary for " + what);
    dict = dictionary();
    if (dict.size() != get64(trailer + 16) ||
        XXH3_64bits(dict.data(), dict.size()) != get64(trailer + 24))
      throw corrupt_error("content: the metadata dictionary of " + what +
                          " is not its base's exact bytes");
  } else if (version == 4 && get64(trailer + 24) != 0) {
    throw corrupt_error("content: bad metadata trailer in " + what);
  }
  const std::vector<std::byte> cbor =
      version >= 3 ? inflate_metadata(meta, what, max_metadata_bytes, dict) : std::move(meta);
  h.meta = std::make_shared<const version_meta>(decode_meta(cbor));
  h.meta_bytes = cbor.size();
  h.data_base = content_prefix_size;
  h.data_bytes = obj.size - content_prefix_size - trailer_size - len;
  return h;
}

}  // namespace ckpt::fs
