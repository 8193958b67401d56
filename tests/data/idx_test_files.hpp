// tests/data/idx_test_files.hpp - writes IDX files, good and bad, for the data tests. Written
// independently of the reader (raw bytes, zlib's gzopen/gzwrite), so the tests do not check the
// reader against itself.
#pragma once

#include <unistd.h>  // getpid: a temporary directory of its own for each test process
#include <zlib.h>    // gzopen, gzwrite, gzclose

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>  // std::istreambuf_iterator
#include <stdexcept>
#include <string>
#include <vector>

namespace trainkit_test {

/// A fresh directory under TRAINKIT_TEST_TMP_DIR (or the system's temp directory), removed with
/// everything in it when the object goes.
class temp_dir {
 public:
  explicit temp_dir(const std::string& name) {
#ifdef TRAINKIT_TEST_TMP_DIR
    const std::filesystem::path root = TRAINKIT_TEST_TMP_DIR;
#else
    const std::filesystem::path root = std::filesystem::temp_directory_path();
#endif
    static std::atomic<int> counter{0};
    path_ = root / ("trainkit-" + name + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

using bytes = std::vector<std::uint8_t>;

inline void put_be32(bytes& b, std::uint32_t v) {
  b.push_back(static_cast<std::uint8_t>(v >> 24));
  b.push_back(static_cast<std::uint8_t>(v >> 16));
  b.push_back(static_cast<std::uint8_t>(v >> 8));
  b.push_back(static_cast<std::uint8_t>(v));
}

/// Header (magic 0 0, type, ndims, big-endian dims) followed by payload.
inline bytes idx_file(std::uint8_t type, const std::vector<std::uint32_t>& dims, const bytes& payload) {
  bytes b = {0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims) put_be32(b, d);
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

inline void write_plain(const std::filesystem::path& p, const bytes& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!f) throw std::runtime_error("test: cannot write " + p.string());
}

inline void write_gz(const std::filesystem::path& p, const bytes& b) {
  gzFile g = gzopen(p.string().c_str(), "wb");
  if (!g) throw std::runtime_error("test: cannot gzopen " + p.string());
  const int n = b.empty() ? 0 : gzwrite(g, b.data(), static_cast<unsigned>(b.size()));
  if (gzclose(g) != Z_OK || n != static_cast<int>(b.size()))
    throw std::runtime_error("test: gzwrite " + p.string());
}

inline bytes read_all(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

/// Writes a MNIST-style pair <prefix>-images-idx3-ubyte and <prefix>-labels-idx1-ubyte (with .gz
/// and compressed when gz). Pixel j of image i is (i * 7 + j) % 256.
inline void write_mnist_pair(const std::filesystem::path& dir, const std::string& prefix,
                             std::uint32_t n_images, std::uint32_t n_labels, std::uint32_t rows,
                             std::uint32_t cols, const std::vector<std::uint8_t>& labels, bool gz) {
  bytes px(static_cast<std::size_t>(n_images) * rows * cols);
  for (std::size_t i = 0; i < n_images; ++i)
    for (std::size_t j = 0; j < std::size_t(rows) * cols; ++j)
      px[i * rows * cols + j] = static_cast<std::uint8_t>((i * 7 + j) % 256);
  bytes lab(n_labels);
  for (std::size_t i = 0; i < n_labels; ++i)
    lab[i] = labels.empty() ? std::uint8_t(i % 10) : labels[i % labels.size()];
  const std::string ext = gz ? ".gz" : "";
  const auto images = idx_file(0x08, {n_images, rows, cols}, px);
  const auto labs = idx_file(0x08, {n_labels}, lab);
  if (gz) {
    write_gz(dir / (prefix + "-images-idx3-ubyte" + ext), images);
    write_gz(dir / (prefix + "-labels-idx1-ubyte" + ext), labs);
  } else {
    write_plain(dir / (prefix + "-images-idx3-ubyte"), images);
    write_plain(dir / (prefix + "-labels-idx1-ubyte"), labs);
  }
}

}  // namespace trainkit_test
