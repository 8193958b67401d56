// trainkit/io/format.hpp - the snapshot file format, version 1: constants, codes and the byte-level
// helpers the writer and the reader share. docs/snapshots.md describes the same layout for readers
// written in other languages.
//
// THE LAYOUT (every integer little-endian; reals are IEEE-754 binary64 bit patterns):
//
//   header, 32 bytes
//     0   magic           8 bytes  89 54 4B 53 4E 41 50 0A   ("\x89TKSNAP\n": the high byte and the
//                                  newline catch 7-bit and text-mode transfers, as PNG's does)
//     8   version         u32      1
//     12  flags           u32      0 (reserved; a reader rejects unknown flags)
//     16  payload_size    u64      bytes after the header
//     24  payload_crc32   u32      zlib crc32 of the payload bytes
//     28  header_crc32    u32      zlib crc32 of header bytes [0, 28)
//   payload
//     u32 section_count, then per section:
//       u32 name_length, name bytes (UTF-8, no terminator), u32 record_count, then per record:
//         u8 kind, u32 name_length, name bytes, then by kind:
//           1 tensor   u8 dtype, u32 ndim, i64 sizes[ndim], u64 byte_count, the elements
//                      (row-major, contiguous, little-endian; byte_count = numel * element size)
//           2 integer  i64
//           3 real     f64
//           4 string   u64 length, bytes
//
// Names are unique within their section, sections unique within the file. The file ends exactly
// at 32 + payload_size: anything shorter is truncated, anything longer is rejected too.
#pragma once

#include <zlib.h>  // crc32_z

#include <array>
#include <bit>      // std::endian, std::bit_cast
#include <cstddef>  // std::byte, std::size_t
#include <cstdint>
#include <cstring>  // std::memcpy
#include <string_view>
#include <type_traits>

#include "trainkit/core/bfloat16.hpp"
#include "trainkit/core/half.hpp"

namespace trainkit::io {

static_assert(std::endian::native == std::endian::little,
              "trainkit::io: the snapshot writer and reader assume a little-endian host");

/// The first eight bytes of every snapshot file.
inline constexpr std::array<unsigned char, 8> snapshot_magic = {0x89, 'T', 'K', 'S', 'N', 'A', 'P', '\n'};
/// The version this library writes and the only one it reads.
inline constexpr std::uint32_t snapshot_format_version = 1;
/// Size of the fixed header.
inline constexpr std::size_t snapshot_header_size = 32;

/// What a record holds.
enum class record_kind : std::uint8_t { tensor = 1, integer = 2, real = 3, string = 4 };

constexpr std::string_view to_string(record_kind k) noexcept {
  switch (k) {
    case record_kind::tensor:
      return "tensor";
    case record_kind::integer:
      return "integer";
    case record_kind::real:
      return "real";
    case record_kind::string:
      return "string";
  }
  return "unknown";
}

/// Element type codes of tensor records.
enum class dtype_code : std::uint8_t {
  float32 = 1,
  float64 = 2,
  float16 = 3,
  bfloat16 = 4,
  int8 = 5,
  uint8 = 6,
  int16 = 7,
  int32 = 8,
  int64 = 9,
  boolean = 10,
};

/// The code of element type T (a static_assert for types a snapshot cannot hold).
template <class T>
constexpr dtype_code dtype_code_of() {
  if constexpr (std::is_same_v<T, float>)
    return dtype_code::float32;
  else if constexpr (std::is_same_v<T, double>)
    return dtype_code::float64;
  else if constexpr (std::is_same_v<T, half>)
    return dtype_code::float16;
  else if constexpr (std::is_same_v<T, bfloat16>)
    return dtype_code::bfloat16;
  else if constexpr (std::is_same_v<T, std::int8_t>)
    return dtype_code::int8;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return dtype_code::uint8;
  else if constexpr (std::is_same_v<T, std::int16_t>)
    return dtype_code::int16;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return dtype_code::int32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return dtype_code::int64;
  else if constexpr (std::is_same_v<T, bool>)
    return dtype_code::boolean;
  else
    static_assert(!sizeof(T*), "trainkit::io: this element type has no snapshot dtype code");
}

/// Bytes per element of a code; 0 for an unknown code.
constexpr std::size_t dtype_size(dtype_code c) noexcept {
  switch (c) {
    case dtype_code::float32:
      return 4;
    case dtype_code::float64:
      return 8;
    case dtype_code::float16:
      return 2;
    case dtype_code::bfloat16:
      return 2;
    case dtype_code::int8:
      return 1;
    case dtype_code::uint8:
      return 1;
    case dtype_code::int16:
      return 2;
    case dtype_code::int32:
      return 4;
    case dtype_code::int64:
      return 8;
    case dtype_code::boolean:
      return 1;
  }
  return 0;
}

/// The names PyTorch prints (dtype_name<T>() spells the same ones).
constexpr std::string_view to_string(dtype_code c) noexcept {
  switch (c) {
    case dtype_code::float32:
      return "float32";
    case dtype_code::float64:
      return "float64";
    case dtype_code::float16:
      return "float16";
    case dtype_code::bfloat16:
      return "bfloat16";
    case dtype_code::int8:
      return "int8";
    case dtype_code::uint8:
      return "uint8";
    case dtype_code::int16:
      return "int16";
    case dtype_code::int32:
      return "int32";
    case dtype_code::int64:
      return "int64";
    case dtype_code::boolean:
      return "bool";
  }
  return "unknown";
}

namespace detail {

/// zlib's crc32 over any length (crc32_z takes a size_t; crc = 0 starts a new checksum).
inline std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t n) noexcept {
  if (n == 0) return crc;
  return static_cast<std::uint32_t>(::crc32_z(crc, static_cast<const Bytef*>(data), n));
}

/// Writes v's bytes at p (the host is little-endian, see the static_assert above).
template <class V>
inline void store_le(unsigned char* p, V v) noexcept {
  static_assert(std::is_trivially_copyable_v<V>);
  std::memcpy(p, &v, sizeof(V));
}
template <class V>
inline V load_le(const unsigned char* p) noexcept {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

/// The 32-byte header for a payload of `size` bytes with checksum `crc`.
inline std::array<unsigned char, snapshot_header_size> make_header(std::uint64_t size,
                                                                   std::uint32_t crc) noexcept {
  std::array<unsigned char, snapshot_header_size> h{};
  std::memcpy(h.data(), snapshot_magic.data(), snapshot_magic.size());
  store_le<std::uint32_t>(h.data() + 8, snapshot_format_version);
  store_le<std::uint32_t>(h.data() + 12, 0);
  store_le<std::uint64_t>(h.data() + 16, size);
  store_le<std::uint32_t>(h.data() + 24, crc);
  store_le<std::uint32_t>(h.data() + 28, crc32_update(0, h.data(), 28));
  return h;
}

}  // namespace detail

}  // namespace trainkit::io
