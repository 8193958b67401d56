// tests/fuzz/fuzz_files.hpp - what the harnesses of path-taking readers share: a per-process
// scratch directory (under $TMPDIR, which scripts/fuzz.sh points into build-fuzz/) and writing one
// input to a file there.
#pragma once

#include <unistd.h>  // getpid

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace fuzz {

/// $TMPDIR (else /tmp) / trainkit_fuzz_<name>_<pid>, created.
inline std::filesystem::path scratch_dir(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  const std::filesystem::path base = tmp && *tmp ? tmp : "/tmp";
  std::filesystem::path d = base / ("trainkit_fuzz_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d;
}

/// Writes the input to p; aborts when it cannot (then the harness is broken, not the reader).
inline void write_file(const std::filesystem::path& p, const std::uint8_t* data, std::size_t size) {
  std::FILE* f = std::fopen(p.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  if (std::fclose(f) != 0) std::abort();
}

}  // namespace fuzz
