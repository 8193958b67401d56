// trainkit/io/snapshot_codec.hpp - the encoder and the decoder of the snapshot file format
// (io/format.hpp), and snapshot's members that write and read file images with them. Included by
// io/snapshot.hpp, which it completes; it may also be included on its own.
#pragma once

#include "trainkit/io/snapshot.hpp"

#include <algorithm>  // std::min
#include <array>
#include <bit>  // std::bit_cast
#include <cstddef>
#include <cstdint>
#include <cstring>  // std::memcpy
#include <deque>    // sections keep their addresses as more are added
#include <filesystem>
#include <fstream>  // reading a whole file
#include <memory>   // std::shared_ptr: the bytes of a read file, shared by its records
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "trainkit/core/device.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/error.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/io/atomic_file.hpp"
#include "trainkit/io/format.hpp"

namespace trainkit::io {

/// The encoder and the decoder of the format (io/format.hpp), kept apart from snapshot's API.
struct snapshot_codec {
  /// Streams the payload to sink(const void*, size_t) and returns {payload size, crc32}.
  template <class Sink>
  static std::pair<std::uint64_t, std::uint32_t> encode_payload(const snapshot& s, Sink&& sink) {
    std::uint64_t size = 0;
    std::uint32_t crc = 0;
    unsigned char small[64];
    auto emit = [&](const void* p, std::size_t n) {
      if (n == 0) return;
      crc = detail::crc32_update(crc, p, n);
      size += n;
      sink(p, n);
    };
    auto u8 = [&](std::uint8_t v) { emit(&v, 1); };
    auto u32 = [&](std::uint32_t v) {
      detail::store_le(small, v);
      emit(small, 4);
    };
    auto u64 = [&](std::uint64_t v) {
      detail::store_le(small, v);
      emit(small, 8);
    };
    auto name = [&](const std::string& n) {
      TRAINKIT_CHECK(n.size() <= 0xffffffffu, usage_error, "snapshot::write",
                     "name of " << n.size() << " bytes");
      u32(static_cast<std::uint32_t>(n.size()));
      emit(n.data(), n.size());
    };
    u32(static_cast<std::uint32_t>(s.sections_.size()));
    for (const auto& sec : s.sections_) {
      name(sec.name_);
      u32(static_cast<std::uint32_t>(sec.records_.size()));
      for (const auto& e : sec.records_) {
        u8(static_cast<std::uint8_t>(e.info.kind));
        name(e.info.name);
        switch (e.info.kind) {
          case record_kind::tensor:
            u8(static_cast<std::uint8_t>(e.info.dtype));
            u32(static_cast<std::uint32_t>(e.info.sizes.size()));
            for (index_t d : e.info.sizes) u64(static_cast<std::uint64_t>(d));
            u64(e.length);
            if (e.length) emit(e.bytes->data() + e.begin, e.length);
            break;
          case record_kind::integer:
            u64(static_cast<std::uint64_t>(e.integer));
            break;
          case record_kind::real:
            u64(std::bit_cast<std::uint64_t>(e.real));
            break;
          case record_kind::string:
            u64(e.text.size());
            emit(e.text.data(), e.text.size());
            break;
        }
      }
    }
    return {size, crc};
  }

  /// Parses a whole file image (header included).
  static snapshot decode(std::shared_ptr<const std::vector<std::byte>> image, const std::string& source) {
    const auto* base = reinterpret_cast<const unsigned char*>(image->data());
    const std::uint64_t file_size = image->size();
    const auto fail_at = [&](std::uint64_t offset, const std::string& what) {
      TRAINKIT_CHECK(
          false, io_error, "snapshot",
          "'" << source << "' is not a valid snapshot: " << what << " (at byte offset " << offset << ")");
    };
    if (file_size < snapshot_header_size) {
      const bool magic_prefix = file_size == 0 || std::memcmp(base, snapshot_magic.data(),
                                                              std::min<std::size_t>(file_size, 8)) == 0;
      fail_at(file_size, magic_prefix ? "truncated: the file has " + std::to_string(file_size) +
                                            " bytes, fewer than the 32-byte header"
                                      : "wrong magic: not a trainkit snapshot");
    }
    if (std::memcmp(base, snapshot_magic.data(), snapshot_magic.size()) != 0)
      fail_at(0, "wrong magic: not a trainkit snapshot");
    const std::uint32_t header_crc = detail::load_le<std::uint32_t>(base + 28);
    if (detail::crc32_update(0, base, 28) != header_crc)
      fail_at(0, "header checksum mismatch (corrupted header)");
    const std::uint32_t version = detail::load_le<std::uint32_t>(base + 8);
    if (version != snapshot_format_version)
      fail_at(8, "format version " + std::to_string(version) + ", this build reads version " +
                     std::to_string(snapshot_format_version));
    const std::uint32_t flags = detail::load_le<std::uint32_t>(base + 12);
    if (flags != 0) fail_at(12, "unknown flags " + std::to_string(flags));
    const std::uint64_t payload = detail::load_le<std::uint64_t>(base + 16);
    const std::uint64_t body = file_size - snapshot_header_size;
    if (body < payload)
      fail_at(file_size, "truncated: the header announces " + std::to_string(payload) +
                             " payload bytes, the file has " + std::to_string(body) + " after the header");
    if (body > payload)
      fail_at(snapshot_header_size + payload,
              std::to_string(body - payload) + " unexpected bytes after the payload");
    const std::uint32_t crc = detail::crc32_update(0, base + snapshot_header_size, payload);
    if (crc != detail::load_le<std::uint32_t>(base + 24))
      fail_at(snapshot_header_size, "payload checksum mismatch (corrupted data)");

    // The checksum matched, so a malformed payload means a writer bug or a crafted file; the
    // cursor still checks every length against what is left.
    std::uint64_t at = snapshot_header_size;
    const std::uint64_t end = file_size;
    auto need = [&](std::uint64_t n, const char* what) {
      if (end - at < n)
        fail_at(at, std::string("malformed payload: ") + what + " needs " + std::to_string(n) + " bytes, " +
                        std::to_string(end - at) + " left");
    };
    auto u8 = [&](const char* what) {
      need(1, what);
      return base[at++];
    };
    auto u32 = [&](const char* what) {
      need(4, what);
      const auto v = detail::load_le<std::uint32_t>(base + at);
      at += 4;
      return v;
    };
    auto u64 = [&](const char* what) {
      need(8, what);
      const auto v = detail::load_le<std::uint64_t>(base + at);
      at += 8;
      return v;
    };
    auto str = [&](std::uint64_t n, const char* what) {
      need(n, what);
      std::string r(reinterpret_cast<const char*>(base + at), static_cast<std::size_t>(n));
      at += n;
      return r;
    };

    snapshot s;
    s.source_ = source;
    const std::uint32_t nsec = u32("the section count");
    for (std::uint32_t i = 0; i < nsec; ++i) {
      const std::uint64_t sec_at = at;
      std::string sname = str(u32("a section name length"), "a section name");
      if (s.index_.count(sname)) fail_at(sec_at, "section '" + sname + "' appears twice");
      s.index_.emplace(sname, s.sections_.size());
      s.sections_.push_back(snapshot_section(std::move(sname), source, sec_at));
      snapshot_section& sec = s.sections_.back();
      const std::uint32_t nrec = u32("a record count");
      for (std::uint32_t j = 0; j < nrec; ++j) {
        const std::uint64_t rec_at = at;
        const std::uint8_t kind = u8("a record kind");
        std::string rname = str(u32("a record name length"), "a record name");
        if (kind < 1 || kind > 4)
          fail_at(rec_at, "record '" + rname + "' of section '" + sec.name_ + "' has unknown kind " +
                              std::to_string(kind));
        if (sec.index_.count(rname))
          fail_at(rec_at, "record '" + rname + "' appears twice in section '" + sec.name_ + "'");
        snapshot_section::entry e;
        e.info.name = rname;
        e.info.kind = static_cast<record_kind>(kind);
        e.info.file_offset = rec_at;
        switch (e.info.kind) {
          case record_kind::tensor: {
            const auto code = static_cast<dtype_code>(u8("a dtype"));
            const std::size_t esize = dtype_size(code);
            if (esize == 0) fail_at(rec_at, "tensor '" + rname + "' has an unknown dtype code");
            const std::uint32_t ndim = u32("a tensor rank");
            if (ndim > 64) fail_at(rec_at, "tensor '" + rname + "' has rank " + std::to_string(ndim));
            // The byte count of the nonzero sizes must not overflow even when a zero size makes
            // the tensor empty: numel() and the strides multiply them all (found by fuzzing).
            std::uint64_t nonzero_bytes = esize;
            bool has_zero = false;
            for (std::uint32_t d = 0; d < ndim; ++d) {
              const auto v = static_cast<std::int64_t>(u64("a tensor size"));
              if (v < 0) fail_at(rec_at, "tensor '" + rname + "' has a negative size");
              e.info.sizes.push_back(v);
              if (v == 0)
                has_zero = true;
              else if (nonzero_bytes > (std::uint64_t(1) << 62) / static_cast<std::uint64_t>(v))
                fail_at(rec_at, "tensor '" + rname + "' has sizes " + trainkit::to_string(e.info.sizes) +
                                    " (read so far), whose product overflows");
              else
                nonzero_bytes *= static_cast<std::uint64_t>(v);
            }
            e.info.dtype = code;
            const std::uint64_t numel_bytes = has_zero ? 0 : nonzero_bytes;
            const std::uint64_t nbytes = u64("a tensor byte count");
            if (nbytes != numel_bytes)
              fail_at(rec_at, "tensor '" + rname + "' of shape " + trainkit::to_string(e.info.sizes) +
                                  " and dtype " + std::string(to_string(code)) + " holds " +
                                  std::to_string(nbytes) + " bytes");
            need(nbytes, "tensor data");
            if (code == dtype_code::boolean)  // any other byte is not a bool: reading it is UB
              for (std::uint64_t k = 0; k < nbytes; ++k)
                if (base[at + k] > 1)
                  fail_at(at + k, "bool tensor '" + rname + "' holds the byte " + std::to_string(base[at + k]) +
                                      " at element " + std::to_string(k) + " (0 or 1 expected)");
            e.bytes = image;
            e.begin = static_cast<std::size_t>(at);
            e.length = static_cast<std::size_t>(nbytes);
            at += nbytes;
            break;
          }
          case record_kind::integer:
            e.integer = static_cast<std::int64_t>(u64("an integer"));
            break;
          case record_kind::real:
            e.real = std::bit_cast<double>(u64("a real"));
            break;
          case record_kind::string:
            e.text = str(u64("a string length"), "a string");
            break;
        }
        sec.index_.emplace(std::move(rname), sec.records_.size());
        sec.records_.push_back(std::move(e));
      }
    }
    if (at != end)
      fail_at(at, "malformed payload: " + std::to_string(end - at) + " bytes after the last section");
    return s;
  }
};

inline std::vector<std::byte> snapshot::to_bytes() const {
  std::vector<std::byte> out(snapshot_header_size);
  const auto [size, crc] = snapshot_codec::encode_payload(*this, [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
  });
  const auto h = detail::make_header(size, crc);
  std::memcpy(out.data(), h.data(), h.size());
  return out;
}

inline void snapshot::write(const std::filesystem::path& path, const write_options& opts) const {
  atomic_file f(path, opts);
  // Small fields are gathered in a buffer; tensor data larger than it goes straight to the file.
  constexpr std::size_t cap = std::size_t(1) << 20;
  std::vector<unsigned char> buf;
  buf.reserve(cap);
  const std::array<unsigned char, snapshot_header_size> placeholder{};
  f.write(placeholder.data(), placeholder.size());
  auto flush = [&] {
    if (!buf.empty()) f.write(buf.data(), buf.size());
    buf.clear();
  };
  const auto [size, crc] = snapshot_codec::encode_payload(*this, [&](const void* p, std::size_t n) {
    if (buf.size() + n > cap) flush();
    if (n >= cap) {
      f.write(p, n);
    } else {
      const auto* b = static_cast<const unsigned char*>(p);
      buf.insert(buf.end(), b, b + n);
    }
  });
  flush();
  const auto h = detail::make_header(size, crc);
  f.write_at(0, h.data(), h.size());
  f.commit();
}

inline snapshot snapshot::read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  TRAINKIT_CHECK(in.good(), io_error, "snapshot", "cannot open '" << path.string() << "' for reading");
  const std::streamoff n = in.tellg();
  TRAINKIT_CHECK(n >= 0, io_error, "snapshot", "cannot determine the size of '" << path.string() << "'");
  auto image = std::make_shared<std::vector<std::byte>>(static_cast<std::size_t>(n));
  in.seekg(0);
  if (n > 0) in.read(reinterpret_cast<char*>(image->data()), n);
  TRAINKIT_CHECK(in.gcount() == n, io_error, "snapshot",
                 "reading '" << path.string() << "' stopped at byte offset " << in.gcount() << " of " << n);
  return snapshot_codec::decode(std::move(image), path.string());
}

inline snapshot snapshot::from_bytes(std::vector<std::byte> bytes, std::string source) {
  return snapshot_codec::decode(std::make_shared<const std::vector<std::byte>>(std::move(bytes)), source);
}

}  // namespace trainkit::io
