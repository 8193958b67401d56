// trainkit/data/idx.hpp - the IDX file format of MNIST and Fashion-MNIST: a validating reader for
// plain and gzip-compressed files, and the decoded array.
//
// THE FORMAT (LeCun's MNIST page). All integers big-endian.
//   bytes 0-1   0x00 0x00
//   byte  2     element type: 0x08 ubyte, 0x09 signed byte, 0x0B short (2 bytes), 0x0C int (4),
//               0x0D float (4), 0x0E double (8)
//   byte  3     number of dimensions, 1..8 here (the format allows up to 255; nothing uses > 8)
//   then        one 32-bit size per dimension
//   then        the elements in row-major order, each big-endian; exactly prod(dims) of them.
// A file is read as gzip when it starts with the gzip magic 1f 8b, whatever its name; zlib
// (gzopen/gzread) decompresses it. Anything else is read as plain IDX.
#pragma once

#include <zlib.h>  // gzopen, gzread, gzerror, gzclose_r, gzbuffer: gzip decompression

#include <algorithm>   // std::min, std::max
#include <bit>         // std::bit_cast: big-endian words to float/double
#include <cerrno>      // errno after fopen/fread/gzopen
#include <cstddef>     // std::size_t, std::ptrdiff_t
#include <cstdint>     // std::uint8_t, std::uint32_t, std::uint64_t
#include <cstdio>      // std::FILE, std::fopen, std::fread, std::ferror
#include <cstring>     // std::strerror
#include <filesystem>  // std::filesystem::path
#include <limits>      // std::numeric_limits
#include <string>
#include <string_view>
#include <utility>  // std::exchange
#include <vector>

#include "trainkit/backend/cpu/elementwise.hpp"  // host loops behind copy_: the data lives on the host
#include "trainkit/config.hpp"                   // TRAINKIT_HAS_OPENMP
#include "trainkit/core/dtype.hpp"               // element
#include "trainkit/ops/elementwise.hpp"         // copy_, behind tensor::contiguous()/to_vector()
#include "trainkit/core/error.hpp"               // io_error, value_error, TRAINKIT_CHECK
#include "trainkit/core/shape.hpp"               // index_t, shape, to_string
#include "trainkit/core/tensor.hpp"              // tensor

namespace trainkit::data {

// ---- Element type codes ------------------------------------------------------------------------

/// IDX element type codes (byte 2 of the header).
inline constexpr std::uint8_t idx_ubyte = 0x08;
inline constexpr std::uint8_t idx_byte = 0x09;
inline constexpr std::uint8_t idx_short = 0x0B;
inline constexpr std::uint8_t idx_int = 0x0C;
inline constexpr std::uint8_t idx_float = 0x0D;
inline constexpr std::uint8_t idx_double = 0x0E;

/// Most dimensions a file may declare (MNIST uses 1 and 3).
inline constexpr int idx_max_dims = 8;

/// Bytes per element of a type code; 0 for a code that is not an IDX type.
constexpr std::size_t idx_element_size(std::uint8_t type) noexcept {
  switch (type) {
    case idx_ubyte:
    case idx_byte:
      return 1;
    case idx_short:
      return 2;
    case idx_int:
    case idx_float:
      return 4;
    case idx_double:
      return 8;
    default:
      return 0;
  }
}

/// The format's name for a type code ("ubyte", "float"...), or "unknown".
constexpr std::string_view idx_type_name(std::uint8_t type) noexcept {
  switch (type) {
    case idx_ubyte:
      return "ubyte";
    case idx_byte:
      return "byte";
    case idx_short:
      return "short";
    case idx_int:
      return "int";
    case idx_float:
      return "float";
    case idx_double:
      return "double";
    default:
      return "unknown";
  }
}

namespace detail {
/// "0x0B": how messages print a header byte.
inline std::string hex2(unsigned v) {
  constexpr char digits[] = "0123456789ABCDEF";
  return std::string("0x") + digits[(v >> 4) & 0xF] + digits[v & 0xF];
}
}  // namespace detail

// ---- The decoded file ----------------------------------------------------------------------------

/// The contents of an IDX file: its dimensions, its element type code and its payload bytes as
/// they are in the file (big-endian elements; for ubyte/byte that is simply the values). The
/// typed helpers decode and convert. read_idx guarantees bytes.size() == numel() * element_size().
struct idx_array {
  shape dims;                       ///< sizes, outermost first ([N, rows, cols] for MNIST images)
  std::uint8_t type = 0;            ///< one of idx_ubyte ... idx_double
  std::vector<std::uint8_t> bytes;  ///< payload exactly as stored (big-endian)

  index_t numel() const noexcept { return trainkit::numel(dims); }
  std::size_t element_size() const noexcept { return idx_element_size(type); }

  /// Element i (row-major) decoded from big-endian and converted to T with static_cast.
  template <element T>
  T get(index_t i) const {
    TRAINKIT_CHECK(i >= 0 && i < numel(), index_error, "idx_array::get",
                   "index " << i << " is out of range for dims " << to_string(dims));
    check_consistent("idx_array::get");
    return decode<T>(static_cast<std::size_t>(i));
  }

  /// All elements decoded and converted to T, as a tensor of sizes dims (parallel for big arrays).
  template <element T>
  tensor<T> to_tensor() const {
    check_consistent("idx_array::to_tensor");
    auto out = tensor<T>::empty(dims);
    decode_into(out.data());
    return out;
  }

  /// All elements decoded and converted to T, row-major.
  template <element T>
  std::vector<T> to_vector() const {
    check_consistent("idx_array::to_vector");
    std::vector<T> out(static_cast<std::size_t>(numel()));
    decode_into(out.data());
    return out;
  }

 private:
  void check_consistent(const char* op) const {
    TRAINKIT_CHECK(element_size() != 0, value_error, op,
                   "type code " << detail::hex2(type) << " is not an IDX element type");
    TRAINKIT_CHECK(bytes.size() == static_cast<std::size_t>(numel()) * element_size(), value_error, op,
                   "dims " << to_string(dims) << " of " << idx_type_name(type) << " need "
                           << static_cast<std::size_t>(numel()) * element_size() << " bytes, the array holds "
                           << bytes.size());
  }

  /// The big-endian element at index i, as its stored type S.
  template <class S>
  S load(std::size_t i) const noexcept {
    const std::uint8_t* p = bytes.data() + i * sizeof(S);
    if constexpr (sizeof(S) == 1) {
      return static_cast<S>(p[0]);
    } else {
      using U = std::conditional_t<sizeof(S) == 2, std::uint16_t,
                                   std::conditional_t<sizeof(S) == 4, std::uint32_t, std::uint64_t>>;
      U u = 0;
      for (std::size_t k = 0; k < sizeof(S); ++k) u = static_cast<U>((u << 8) | p[k]);
      return std::bit_cast<S>(u);
    }
  }

  template <class T>
  T decode(std::size_t i) const {
    switch (type) {
      case idx_ubyte:
        return static_cast<T>(load<std::uint8_t>(i));
      case idx_byte:
        return static_cast<T>(load<std::int8_t>(i));
      case idx_short:
        return static_cast<T>(load<std::int16_t>(i));
      case idx_int:
        return static_cast<T>(load<std::int32_t>(i));
      case idx_float:
        return static_cast<T>(load<float>(i));
      case idx_double:
        return static_cast<T>(load<double>(i));
      default:
        return T{};
    }
  }

  template <class T>
  void decode_into(T* dst) const {
    const auto n = static_cast<std::ptrdiff_t>(numel());
    switch (type) {  // one loop per type so the decode is not re-dispatched per element
      case idx_ubyte:
        decode_all<T, std::uint8_t>(dst, n);
        break;
      case idx_byte:
        decode_all<T, std::int8_t>(dst, n);
        break;
      case idx_short:
        decode_all<T, std::int16_t>(dst, n);
        break;
      case idx_int:
        decode_all<T, std::int32_t>(dst, n);
        break;
      case idx_float:
        decode_all<T, float>(dst, n);
        break;
      case idx_double:
        decode_all<T, double>(dst, n);
        break;
      default:
        break;  // excluded by check_consistent
    }
  }

  template <class T, class S>
  void decode_all(T* dst, std::ptrdiff_t n) const {
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) if (n > 65536)
#endif
    for (std::ptrdiff_t i = 0; i < n; ++i) dst[i] = static_cast<T>(load<S>(static_cast<std::size_t>(i)));
  }
};

// ---- Reading -------------------------------------------------------------------------------------

namespace detail {

/// The system's message for errno e ("No such file or directory").
inline std::string errno_message(int e) {
  return e ? std::string(std::strerror(e)) : std::string("unknown error");
}

/// A sequential byte reader over a plain file (stdio) or a gzip stream (zlib), chosen by the first
/// two bytes of the file. Every failure is an io_error that names the file.
class idx_byte_source {
 public:
  explicit idx_byte_source(const std::filesystem::path& path) : path_(path.string()) {
    errno = 0;
    std::FILE* f = std::fopen(path_.c_str(), "rb");
    TRAINKIT_CHECK(f != nullptr, io_error, "read_idx",
                   "cannot open '" << path_ << "': " << errno_message(errno));
    file_ = f;
    unsigned char magic[2] = {0, 0};
    const std::size_t n = std::fread(magic, 1, 2, file_);
    if (std::ferror(file_)) {
      const int e = errno;
      close();
      TRAINKIT_CHECK(false, io_error, "read_idx", "cannot read '" << path_ << "': " << errno_message(e));
    }
    gzip_ = n == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    if (gzip_) {
      // zlib reopens the path itself; the stdio handle only served to look at the magic.
      close();
      errno = 0;
      gz_ = gzopen(path_.c_str(), "rb");
      TRAINKIT_CHECK(gz_ != nullptr, io_error, "read_idx",
                     "cannot open '" << path_ << "' as gzip: " << errno_message(errno));
      gzbuffer(gz_, 1u << 17);  // 128 KiB input buffer: fewer read() calls than zlib's 8 KiB default
    } else {
      std::rewind(file_);
    }
  }
  idx_byte_source(const idx_byte_source&) = delete;
  idx_byte_source& operator=(const idx_byte_source&) = delete;
  ~idx_byte_source() { close(); }

  bool gzip() const noexcept { return gzip_; }
  const std::string& path() const noexcept { return path_; }
  /// Bytes delivered so far (decompressed bytes for gzip).
  std::uint64_t offset() const noexcept { return offset_; }

  /// Reads up to n bytes; fewer only at the end of the data. Corrupt gzip data and read errors throw.
  std::size_t read(void* dst, std::size_t n) {
    auto* out = static_cast<unsigned char*>(dst);
    std::size_t got = 0;
    while (got < n) {
      std::size_t k = 0;
      if (gzip_) {
        const auto want = static_cast<unsigned>(std::min<std::size_t>(n - got, 1u << 30));
        const int r = gzread(gz_, out + got, want);
        int err = Z_OK;
        const char* msg = gzerror(gz_, &err);
        // Z_BUF_ERROR is zlib's "unexpected end of file": the compressed stream was cut short.
        TRAINKIT_CHECK(r >= 0 && err == Z_OK, io_error, "read_idx",
                       "'" << path_ << "': corrupt gzip stream after " << offset_ + (r > 0 ? unsigned(r) : 0u)
                           << " decompressed bytes: " << zlib_message(msg, err));
        k = static_cast<std::size_t>(r);
      } else {
        k = std::fread(out + got, 1, n - got, file_);
        if (k == 0 && std::ferror(file_))
          TRAINKIT_CHECK(
              false, io_error, "read_idx",
              "cannot read '" << path_ << "' after " << offset_ << " bytes: " << errno_message(errno));
      }
      if (k == 0) break;
      got += k;
      offset_ += k;
    }
    return got;
  }

 private:
  /// gzerror's text without the "path: " prefix zlib puts in front (the message names the file once).
  std::string zlib_message(const char* msg, int err) const {
    std::string m = msg ? msg : "";
    const std::string prefix = path_ + ": ";
    if (m.compare(0, prefix.size(), prefix) == 0) m.erase(0, prefix.size());
    if (err == Z_ERRNO) m += std::string(" (") + errno_message(errno) + ")";
    return m.empty() ? "zlib error " + std::to_string(err) : m;
  }

  void close() noexcept {
    if (file_) std::fclose(std::exchange(file_, nullptr));
    if (gz_) gzclose_r(std::exchange(gz_, nullptr));
  }

  std::string path_;
  std::FILE* file_ = nullptr;
  gzFile gz_ = nullptr;
  bool gzip_ = false;
  std::uint64_t offset_ = 0;
};

}  // namespace detail

/// Reads and validates an IDX file, plain or gzip (detected by its magic bytes, not its name).
/// Throws io_error, naming the file, when it cannot be opened or read, when the gzip stream is
/// corrupt (zlib's message), when the magic, type code or dimension count is wrong, when the
/// payload is shorter than the dimensions require (expected and actual byte counts, and the
/// offset where the data ended) or when bytes follow the payload.
inline idx_array read_idx(const std::filesystem::path& path) {
  detail::idx_byte_source src(path);
  const std::string& name = src.path();
  const char* what = src.gzip() ? " (decompressed)" : "";

  unsigned char head[4] = {0, 0, 0, 0};
  const std::size_t got_head = src.read(head, 4);
  TRAINKIT_CHECK(got_head == 4, io_error, "read_idx",
                 "'" << name << "' is truncated: an IDX header needs at least 4 bytes, the file" << what
                     << " has " << got_head);
  TRAINKIT_CHECK(head[0] == 0 && head[1] == 0, io_error, "read_idx",
                 "'" << name << "' is not an IDX file: bad magic, the first two bytes" << what << " are "
                     << detail::hex2(head[0]) << " " << detail::hex2(head[1]) << ", expected 0x00 0x00");
  idx_array a;
  a.type = head[2];
  TRAINKIT_CHECK(idx_element_size(a.type) != 0, io_error, "read_idx",
                 "'" << name << "': unknown IDX type code " << detail::hex2(a.type)
                     << " (expected 0x08 ubyte, 0x09 byte, 0x0B short, 0x0C int, 0x0D float or 0x0E double)");
  const int ndims = head[3];
  TRAINKIT_CHECK(
      ndims >= 1 && ndims <= idx_max_dims, io_error, "read_idx",
      "'" << name << "': the header declares " << ndims << " dimensions, expected 1 to " << idx_max_dims);

  const std::size_t header_bytes = 4 + 4 * static_cast<std::size_t>(ndims);
  unsigned char raw_dims[4 * idx_max_dims];
  const std::size_t got_dims = src.read(raw_dims, 4 * static_cast<std::size_t>(ndims));
  TRAINKIT_CHECK(got_dims == 4 * static_cast<std::size_t>(ndims), io_error, "read_idx",
                 "'" << name << "' is truncated: the header of " << ndims << " dimensions needs "
                     << header_bytes << " bytes, the data" << what << " ends at byte offset "
                     << 4 + got_dims);
  const std::size_t esize = idx_element_size(a.type);
  // The payload size in bytes, refusing headers whose product does not fit (they cannot be real).
  // A zero dimension makes the payload empty, but the other dims must still multiply without
  // overflow: numel() and every stride multiply them (a fuzzer found [0xffffffff, 0xffffffff, 0]).
  std::uint64_t nonzero_bytes = esize;
  bool fits = true, has_zero = false;
  a.dims.resize(static_cast<std::size_t>(ndims));
  for (int d = 0; d < ndims; ++d) {
    const unsigned char* p = raw_dims + 4 * d;
    const std::uint32_t v =
        (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) | p[3];
    a.dims[static_cast<std::size_t>(d)] = static_cast<index_t>(v);
    if (v == 0) {
      has_zero = true;
    } else if (nonzero_bytes > (std::uint64_t(1) << 62) / v) {
      fits = false;
    } else {
      nonzero_bytes *= v;
    }
  }
  TRAINKIT_CHECK(fits && nonzero_bytes <= std::numeric_limits<std::size_t>::max() / 2, io_error, "read_idx",
                 "'" << name << "': the header declares dims " << to_string(a.dims) << " of "
                     << idx_type_name(a.type) << ": their product overflows (more bytes than any file can hold)");
  const std::uint64_t expected = has_zero ? 0 : nonzero_bytes;

  // The buffer grows as data arrives, so a header that lies about the sizes cannot make us
  // allocate far more than the file really holds.
  const auto want = static_cast<std::size_t>(expected);
  std::size_t got = 0;
  while (got < want) {
    if (a.bytes.size() == got)
      a.bytes.resize(std::min(want, std::max<std::size_t>(2 * got, std::size_t(1) << 20)));
    const std::size_t k = src.read(a.bytes.data() + got, a.bytes.size() - got);
    if (k == 0) break;
    got += k;
  }
  TRAINKIT_CHECK(got == want, io_error, "read_idx",
                 "'" << name << "' is truncated: dims " << to_string(a.dims) << " of "
                     << idx_type_name(a.type) << " need " << want << " payload bytes after the "
                     << header_bytes << "-byte header, got " << got << "; the data" << what
                     << " ends at byte offset " << header_bytes + got << " of an expected "
                     << header_bytes + want);

  unsigned char extra[4096];
  std::uint64_t trailing = 0;
  while (const std::size_t k = src.read(extra, sizeof extra)) trailing += k;
  TRAINKIT_CHECK(trailing == 0, io_error, "read_idx",
                 "'" << name << "' has " << trailing << " trailing bytes after the payload: dims "
                     << to_string(a.dims) << " of " << idx_type_name(a.type) << " make "
                     << header_bytes + want << " bytes, the file" << what << " has "
                     << header_bytes + want + trailing);
  return a;
}

}  // namespace trainkit::data
