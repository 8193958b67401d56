// tests/io/io_test_util.hpp - what the io tests share: fresh scratch directories under
// TRAINKIT_TEST_TMP_DIR and raw file surgery (truncate, flip a byte).
#pragma once

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace io_test {

/// An empty directory TRAINKIT_TEST_TMP_DIR/<name> (emptied first if it exists; one per test, so
/// runs do not pile up).
inline std::filesystem::path fresh_dir(const std::string& name) {
  const auto d = std::filesystem::path(TRAINKIT_TEST_TMP_DIR) / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

inline std::vector<char> read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
inline void write_all(const std::filesystem::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
/// Flips the bits of the byte at offset.
inline void corrupt_byte(const std::filesystem::path& p, std::size_t offset) {
  auto b = read_all(p);
  b.at(offset) = static_cast<char>(~b.at(offset));
  write_all(p, b);
}
/// Keeps the first n bytes.
inline void truncate_to(const std::filesystem::path& p, std::size_t n) { std::filesystem::resize_file(p, n); }

/// Files in d whose name contains `part`.
inline std::size_t count_files_with(const std::filesystem::path& d, const std::string& part) {
  std::size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(d))
    if (e.path().filename().string().find(part) != std::string::npos) ++n;
  return n;
}

}  // namespace io_test
