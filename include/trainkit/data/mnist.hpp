// trainkit/data/mnist.hpp - MNIST and Fashion-MNIST (the same IDX layout) as tensors.
#pragma once

#include <algorithm>   // std::min
#include <cstddef>     // std::ptrdiff_t
#include <cstdint>     // std::int64_t, std::uint8_t
#include <filesystem>  // std::filesystem::path, exists
#include <optional>
#include <string>
#include <system_error>  // std::error_code (exists() without throwing)
#include <type_traits>   // std::conditional_t

#include "trainkit/backend/cpu/elementwise.hpp"  // host loops behind copy_: the data lives on the host
#include "trainkit/config.hpp"                   // TRAINKIT_HAS_OPENMP
#include "trainkit/core/dtype.hpp"               // floating_element
#include "trainkit/ops/elementwise.hpp"         // copy_, behind tensor::contiguous()/to_vector()
#include "trainkit/core/error.hpp"               // io_error, value_error
#include "trainkit/core/shape.hpp"               // index_t, to_string
#include "trainkit/core/tensor.hpp"              // tensor
#include "trainkit/data/dataset.hpp"             // split, basic_dataset
#include "trainkit/data/idx.hpp"                 // read_idx

namespace trainkit::data {

/// Number of classes in MNIST and Fashion-MNIST; every label must be below it.
inline constexpr index_t mnist_classes = 10;

/// Per-pixel mean and standard deviation of the training images scaled to [0, 1] (the values
/// torchvision examples use), for mnist_options::mean / stddev.
inline constexpr double mnist_mean = 0.1307, mnist_std = 0.3081;
inline constexpr double fashion_mnist_mean = 0.2860, fashion_mnist_std = 0.3530;

/// How load_mnist prepares the data. Pixels are scaled to [0, 1] and then normalised to
/// (x - mean) / stddev; the defaults leave them in [0, 1].
/// `load_mnist(dir, split::train, {.mean = fashion_mnist_mean, .stddev = fashion_mnist_std, .limit = 1000})`
struct mnist_options {
  double mean = 0.0;
  double stddev = 1.0;  ///< must be > 0
  /// Keep only the first `limit` samples (the whole file is still read and validated).
  std::optional<index_t> limit = std::nullopt;
};

namespace detail {

/// `dir/stem.gz` when it exists, else `dir/stem`; io_error naming both when neither does.
inline std::filesystem::path find_idx_file(const std::filesystem::path& dir, const std::string& stem) {
  std::error_code ec;
  const std::filesystem::path gz = dir / (stem + ".gz"), plain = dir / stem;
  if (std::filesystem::exists(gz, ec)) return gz;
  if (std::filesystem::exists(plain, ec)) return plain;
  // The usual cause is a data set that is not installed: say where Debian puts one.
  constexpr const char* hint =
      " (Fashion-MNIST on Debian: apt-get install dataset-fashion-mnist, then --data "
      "/usr/share/datasets/fashion-mnist)";
  TRAINKIT_CHECK(std::filesystem::is_directory(dir, ec), io_error, "load_mnist",
                 "the data directory '" << dir.string() << "' does not exist" << hint);
  TRAINKIT_CHECK(false, io_error, "load_mnist",
                 "neither '" << gz.string() << "' nor '" << plain.string() << "' exists" << hint);
  return {};
}

}  // namespace detail

/// Reads `{train,t10k}-images-idx3-ubyte[.gz]` and `{train,t10k}-labels-idx1-ubyte[.gz]` from dir
/// (the .gz name is tried first; the content decides whether it is decompressed). Checks that the
/// images are ubyte [N, rows, cols], the labels ubyte [N] with the same N and every label below
/// mnist_classes; each failure is an io_error naming the file(s), counts and values.
/// \tparam T element type of the images
template <floating_element T = float>
basic_dataset<T> load_mnist(const std::filesystem::path& dir, split which,
                            const mnist_options& options = {}) {
  TRAINKIT_CHECK(options.stddev > 0.0, value_error, "load_mnist",
                 "stddev must be > 0, got " << options.stddev);
  TRAINKIT_CHECK(!options.limit || *options.limit >= 0, value_error, "load_mnist",
                 "limit must be >= 0, got " << options.limit.value_or(0));
  const std::string prefix = which == split::train ? "train" : "t10k";
  const std::filesystem::path image_path = detail::find_idx_file(dir, prefix + "-images-idx3-ubyte");
  const std::filesystem::path label_path = detail::find_idx_file(dir, prefix + "-labels-idx1-ubyte");
  const idx_array images = read_idx(image_path);
  const idx_array labels = read_idx(label_path);

  TRAINKIT_CHECK(images.type == idx_ubyte && images.dims.size() == 3, io_error, "load_mnist",
                 "'" << image_path.string() << "' should hold ubyte images [N, rows, cols], it holds "
                     << idx_type_name(images.type) << " " << trainkit::to_string(images.dims));
  TRAINKIT_CHECK(images.dims[1] > 0 && images.dims[2] > 0, io_error, "load_mnist",
                 "'" << image_path.string() << "' has empty images: dims " << trainkit::to_string(images.dims));
  TRAINKIT_CHECK(labels.type == idx_ubyte && labels.dims.size() == 1, io_error, "load_mnist",
                 "'" << label_path.string() << "' should hold ubyte labels [N], it holds "
                     << idx_type_name(labels.type) << " " << trainkit::to_string(labels.dims));
  TRAINKIT_CHECK(images.dims[0] == labels.dims[0], io_error, "load_mnist",
                 "'" << image_path.string() << "' holds " << images.dims[0] << " images but '"
                     << label_path.string() << "' holds " << labels.dims[0] << " labels");

  const index_t total = images.dims[0];
  const index_t n = options.limit ? std::min(*options.limit, total) : total;
  const index_t rows = images.dims[1], cols = images.dims[2];

  // Every label of the file is checked, not only the kept ones: a bad file is bad as a whole.
  for (index_t i = 0; i < total; ++i) {
    const unsigned v = labels.bytes[static_cast<std::size_t>(i)];
    TRAINKIT_CHECK(v < mnist_classes, io_error, "load_mnist",
                   "'" << label_path.string() << "': label " << i << " is " << v << ", expected 0 to "
                       << mnist_classes - 1);
  }

  basic_dataset<T> out;
  out.images = tensor<T>::empty({n, 1, rows, cols});
  out.labels = tensor<std::int64_t>::empty({n});
  // x = p / 255 (a division, not a multiplication by 1/255, so 255 maps to exactly 1), then
  // (x - mean) / stddev; in float, or in double for double images.
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const C mean = static_cast<C>(options.mean), inv_std = static_cast<C>(1.0 / options.stddev);
  const bool identity = options.mean == 0.0 && options.stddev == 1.0;
  T* img = out.images.data();
  const std::uint8_t* px = images.bytes.data();
  const auto count = static_cast<std::ptrdiff_t>(n * rows * cols);
#if TRAINKIT_HAS_OPENMP
#pragma omp parallel for schedule(static) if (count > 65536)
#endif
  for (std::ptrdiff_t i = 0; i < count; ++i) {
    const C x = static_cast<C>(px[i]) / C(255);
    img[i] = static_cast<T>(identity ? x : (x - mean) * inv_std);
  }
  std::int64_t* lab = out.labels.data();
  for (index_t i = 0; i < n; ++i) lab[i] = labels.bytes[static_cast<std::size_t>(i)];
  return out;
}

}  // namespace trainkit::data
