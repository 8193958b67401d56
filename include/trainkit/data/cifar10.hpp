// trainkit/data/cifar10.hpp - CIFAR-10 in its binary batch format: a validating reader and the
// dataset as tensors.
//
// THE FORMAT (Krizhevsky's CIFAR-10 page, "binary version"). A file is a sequence of records of
// 3073 bytes, no header:
//   byte 0          the label, 0..9 (airplane automobile bird cat deer dog frog horse ship truck)
//   bytes 1-3072    the 32x32 image: 1024 red, then 1024 green, then 1024 blue bytes, each plane
//                   row-major - exactly the [3, 32, 32] (CHW) layout of a tensor
// The release (cifar-10-binary.tar.gz, which unpacks to cifar-10-batches-bin/) holds 10000
// records in each of data_batch_1.bin .. data_batch_5.bin (the training split, in that order) and
// test_batch.bin (the test split).
#pragma once

#include <algorithm>  // std::min
#include <array>
#include <cerrno>      // errno after fopen/fread
#include <cstddef>     // std::size_t, std::ptrdiff_t
#include <cstdint>     // std::int64_t, std::uint8_t, std::uint64_t
#include <cstdio>      // std::FILE, std::fopen, std::fread
#include <filesystem>  // std::filesystem::path, exists, file_size
#include <optional>
#include <string>
#include <string_view>
#include <system_error>  // std::error_code: filesystem calls that must not throw their own errors
#include <type_traits>   // std::conditional_t
#include <utility>       // std::exchange
#include <vector>

#include "trainkit/backend/cpu/elementwise.hpp"  // host loops behind copy_: the data lives on the host
#include "trainkit/config.hpp"                   // TRAINKIT_HAS_OPENMP
#include "trainkit/core/dtype.hpp"               // floating_element
#include "trainkit/core/error.hpp"               // io_error, value_error, TRAINKIT_CHECK
#include "trainkit/core/shape.hpp"               // index_t
#include "trainkit/core/tensor.hpp"              // tensor
#include "trainkit/data/idx.hpp"                 // detail::errno_message
#include "trainkit/data/dataset.hpp"             // split, basic_dataset

namespace trainkit::data {

// ---- Constants of the format ---------------------------------------------------------------------

inline constexpr index_t cifar10_classes = 10;
inline constexpr index_t cifar10_channels = 3, cifar10_height = 32, cifar10_width = 32;
/// Bytes of one image (3 * 32 * 32) and of one record (label byte + image).
inline constexpr std::size_t cifar10_image_bytes = 3072, cifar10_record_bytes = 3073;
/// Records in each file of the official release.
inline constexpr index_t cifar10_records_per_file = 10000;

/// Class names, in label order.
inline constexpr std::array<std::string_view, 10> cifar10_class_names = {
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};

/// Per-channel mean and standard deviation of the training images scaled to [0, 1] (R, G, B), for
/// normalize({.mean = ..., .stddev = ...}) in data/transforms.hpp.
inline constexpr std::array<float, 3> cifar10_mean = {0.4914f, 0.4822f, 0.4465f};
inline constexpr std::array<float, 3> cifar10_std = {0.2470f, 0.2435f, 0.2616f};

/// How load_cifar10 reads a split.
/// `load_cifar10(dir, split::train, {.records_per_file = cifar10_records_per_file, .limit = 5000})`
struct cifar10_options {
  /// When set, every file must hold exactly this many records (cifar10_records_per_file for the
  /// official release); unset accepts any whole number >= 1 (subsets, files written by tests).
  std::optional<index_t> records_per_file = std::nullopt;
  /// Keep only the first `limit` samples of the split (every file is still read and validated).
  std::optional<index_t> limit = std::nullopt;
};

/// The decoded content of one CIFAR-10 file: labels[i] and the 3072 pixel bytes of record i at
/// pixels[i * 3072, (i + 1) * 3072). read_cifar10_file guarantees the sizes agree.
struct cifar10_file {
  std::vector<std::uint8_t> labels;
  std::vector<std::uint8_t> pixels;
  index_t size() const noexcept { return static_cast<index_t>(labels.size()); }
};

/// The file names of a split, in the order their records are concatenated.
inline std::vector<std::string> cifar10_file_names(split which) {
  if (which == split::test) return {"test_batch.bin"};
  return {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"};
}

namespace detail {

/// The size of a CIFAR-10 file after checking it is a whole, non-zero number of records (and
/// `expected` of them when given); io_error naming the file, its size and where a record is cut.
inline index_t cifar10_record_count(const std::filesystem::path& path, std::optional<index_t> expected,
                                    std::string_view op) {
  std::error_code ec;
  const std::uintmax_t bytes = std::filesystem::file_size(path, ec);
  TRAINKIT_CHECK(!ec, io_error, op, "cannot get the size of '" << path.string() << "': " << ec.message());
  const std::uintmax_t whole = bytes / cifar10_record_bytes, rest = bytes % cifar10_record_bytes;
  TRAINKIT_CHECK(rest == 0, io_error, op,
                 "'" << path.string() << "' is " << bytes << " bytes, not a whole number of "
                     << cifar10_record_bytes << "-byte records: record " << whole << " at byte offset "
                     << whole * cifar10_record_bytes << " is incomplete (" << rest << " of "
                     << cifar10_record_bytes << " bytes; truncated file?)");
  TRAINKIT_CHECK(bytes > 0, io_error, op, "'" << path.string() << "' is empty: it holds no records");
  const auto n = static_cast<index_t>(whole);
  TRAINKIT_CHECK(!expected || n == *expected, io_error, op,
                 "'" << path.string() << "' holds " << n << " records (" << bytes << " bytes), expected "
                     << *expected << " (" << static_cast<std::uintmax_t>(*expected) * cifar10_record_bytes
                     << " bytes)");
  return n;
}

/// Reads records [0, n) of a file already sized by cifar10_record_count into label/pixel buffers,
/// checking every label. The pixels of record i go to pixels + i * 3072.
inline void read_cifar10_records(const std::filesystem::path& path, index_t n, std::uint8_t* labels,
                                 std::uint8_t* pixels, std::string_view op) {
  errno = 0;
  std::FILE* f = std::fopen(path.string().c_str(), "rb");
  TRAINKIT_CHECK(f != nullptr, io_error, op,
                 "cannot open '" << path.string() << "': " << errno_message(errno));
  struct closer {
    std::FILE* f;
    ~closer() { std::fclose(f); }
  } close_at_exit{f};
  // Whole records in chunks of 256 (786 KB): one fread each, then split into label and pixels.
  constexpr index_t chunk = 256;
  std::vector<std::uint8_t> buf(static_cast<std::size_t>(chunk) * cifar10_record_bytes);
  for (index_t first = 0; first < n; first += chunk) {
    const index_t k = std::min(chunk, n - first);
    const std::size_t want = static_cast<std::size_t>(k) * cifar10_record_bytes;
    const std::size_t got = std::fread(buf.data(), 1, want, f);
    // The size was checked, so a short read means the file changed or the device failed.
    TRAINKIT_CHECK(
        got == want, io_error, op,
        "cannot read '" << path.string() << "': got " << got << " of " << want << " bytes at byte offset "
                        << static_cast<std::uint64_t>(first) * cifar10_record_bytes
                        << (std::ferror(f) ? ": " + errno_message(errno) : std::string(" (file shrank?)")));
    for (index_t r = 0; r < k; ++r) {
      const std::uint8_t* rec = buf.data() + static_cast<std::size_t>(r) * cifar10_record_bytes;
      TRAINKIT_CHECK(rec[0] < cifar10_classes, io_error, op,
                     "'" << path.string() << "': record " << first + r << " (byte offset "
                         << static_cast<std::uint64_t>(first + r) * cifar10_record_bytes << ") has label "
                         << unsigned(rec[0]) << ", expected 0 to " << cifar10_classes - 1);
      labels[first + r] = rec[0];
      std::copy(rec + 1, rec + cifar10_record_bytes,
                pixels + static_cast<std::size_t>(first + r) * cifar10_image_bytes);
    }
  }
}

/// Where the files of a split are: dir itself, or dir/cifar-10-batches-bin (what the release
/// unpacks to). io_error listing every path looked for when some file is in neither.
inline std::vector<std::filesystem::path> find_cifar10_files(const std::filesystem::path& dir, split which) {
  const std::vector<std::string> names = cifar10_file_names(which);
  const std::filesystem::path candidates[] = {dir, dir / "cifar-10-batches-bin"};
  std::error_code ec;
  for (const auto& base : candidates) {
    std::vector<std::filesystem::path> found;
    for (const auto& name : names)
      if (std::filesystem::is_regular_file(base / name, ec)) found.push_back(base / name);
    if (found.size() == names.size()) return found;
  }
  // Name every path looked for: per place, the missing files, or that the place is not there.
  std::string wanted, places;
  for (const auto& name : names) wanted += (wanted.empty() ? "" : ", ") + name;
  for (const auto& base : candidates) {
    places += places.empty() ? "" : "; ";
    if (!std::filesystem::is_directory(base, ec)) {
      // (appends, not "'" + std::string&&: GCC 12 at -O3 warns a false -Wrestrict on that, bug 105651)
      places += '\'';
      places += base.string();
      places += "' does not exist";
      continue;
    }
    std::string missing;
    for (const auto& name : names)
      if (!std::filesystem::is_regular_file(base / name, ec))
        missing += (missing.empty() ? "'" : ", '") + (base / name).string() + "'";
    places += "missing " + missing;
  }
  TRAINKIT_CHECK(false, io_error, "load_cifar10",
                 "the " << (which == split::train ? "training" : "test") << " split needs " << wanted
                        << " in '" << dir.string()
                        << "' or its cifar-10-batches-bin/ subdirectory: " << places);
  return {};
}

}  // namespace detail

/// Reads and validates one CIFAR-10 file (any name). io_error, naming the file, when it cannot be
/// read, is empty, is not a whole number of 3073-byte records (its size and the offset of the
/// incomplete record), holds a number of records other than expected_records (when given), or
/// has a label >= 10 (the record index, its byte offset and the value).
inline cifar10_file read_cifar10_file(const std::filesystem::path& path,
                                      std::optional<index_t> expected_records = std::nullopt) {
  const index_t n = detail::cifar10_record_count(path, expected_records, "read_cifar10_file");
  cifar10_file out;
  out.labels.resize(static_cast<std::size_t>(n));
  out.pixels.resize(static_cast<std::size_t>(n) * cifar10_image_bytes);
  detail::read_cifar10_records(path, n, out.labels.data(), out.pixels.data(), "read_cifar10_file");
  return out;
}

/// Reads a split of CIFAR-10 from dir (or dir/cifar-10-batches-bin): data_batch_1..5.bin for
/// split::train, test_batch.bin for split::test, every file validated as read_cifar10_file does.
/// Returns images [N, 3, 32, 32] with pixels p / 255 in [0, 1] and labels [N] in [0, 10), records
/// in file order. Normalisation is a transform (data/transforms.hpp), applied per sample.
/// \tparam T element type of the images
template <floating_element T = float>
basic_dataset<T> load_cifar10(const std::filesystem::path& dir, split which,
                              const cifar10_options& options = {}) {
  TRAINKIT_CHECK(!options.limit || *options.limit >= 0, value_error, "load_cifar10",
                 "limit must be >= 0, got " << options.limit.value_or(0));
  TRAINKIT_CHECK(!options.records_per_file || *options.records_per_file >= 1, value_error, "load_cifar10",
                 "records_per_file must be >= 1, got " << options.records_per_file.value_or(0));
  const std::vector<std::filesystem::path> files = detail::find_cifar10_files(dir, which);
  // Every file is sized (and so validated) before anything is allocated or read.
  std::vector<index_t> counts;
  index_t total = 0;
  for (const auto& f : files) {
    counts.push_back(detail::cifar10_record_count(f, options.records_per_file, "load_cifar10"));
    total += counts.back();
  }
  const index_t n = options.limit ? std::min(*options.limit, total) : total;

  basic_dataset<T> out;
  out.images = tensor<T>::empty({n, cifar10_channels, cifar10_height, cifar10_width});
  out.labels = tensor<std::int64_t>::empty({n});
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  std::vector<std::uint8_t> labels, pixels;
  index_t first = 0;  // sample index of the file's record 0
  for (std::size_t f = 0; f < files.size(); ++f) {
    const index_t k = counts[f];
    labels.resize(static_cast<std::size_t>(k));
    pixels.resize(static_cast<std::size_t>(k) * cifar10_image_bytes);
    detail::read_cifar10_records(files[f], k, labels.data(), pixels.data(), "load_cifar10");
    const index_t keep = std::clamp<index_t>(n - first, 0, k);
    std::int64_t* lab = out.labels.data() + first;
    for (index_t i = 0; i < keep; ++i) lab[i] = labels[static_cast<std::size_t>(i)];
    // The record's bytes are already CHW; p / 255 (a division, so 255 maps to exactly 1).
    T* img = out.images.data() + first * static_cast<index_t>(cifar10_image_bytes);
    const std::uint8_t* px = pixels.data();
    const auto count = static_cast<std::ptrdiff_t>(keep) * static_cast<std::ptrdiff_t>(cifar10_image_bytes);
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) if (count > 65536)
#endif
    for (std::ptrdiff_t i = 0; i < count; ++i) img[i] = static_cast<T>(static_cast<C>(px[i]) / C(255));
    first += k;
  }
  return out;
}

}  // namespace trainkit::data
