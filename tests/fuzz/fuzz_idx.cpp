// tests/fuzz/fuzz_idx.cpp - libFuzzer harness for data::read_idx (plain and gzip IDX files).
//
// read_idx only takes a path, so each input is written to a per-process temporary file and read
// back; a file that starts with 1f 8b goes through zlib. A trainkit::error is an expected rejection;
// anything else (a crash, a sanitizer report, another exception type, a huge allocation) is a finding.
// Built and run by scripts/fuzz.sh; reproduce a finding with `build-fuzz/fuzz_idx crash-<sha1>`.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "fuzz_files.hpp"  // scratch_dir, write_file
#include "trainkit/core/error.hpp"
#include "trainkit/data/idx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Bounded inputs: a gzip stream of 64 KiB inflates to at most ~66 MB, well under -rss_limit_mb.
  if (size > (std::size_t(1) << 16)) return 0;
  static const std::filesystem::path path = fuzz::scratch_dir("idx") / "input.idx";
  fuzz::write_file(path, data, size);
  try {
    const trainkit::data::idx_array a = trainkit::data::read_idx(path);
    // read_idx promises bytes.size() == numel() * element_size(); the typed helpers check it too.
    const trainkit::index_t n = a.numel();
    if (n < 0 || static_cast<std::size_t>(n) * a.element_size() != a.bytes.size()) std::abort();
    if (n > 0) {
      volatile double first = a.get<double>(0);
      volatile double last = a.get<double>(n - 1);
      (void)first;
      (void)last;
    }
    if (n <= (trainkit::index_t(1) << 22)) {  // decode everything for inputs of sane size
      const auto t = a.to_tensor<float>();
      if (t.numel() != n) std::abort();
      const auto v = a.to_vector<double>();  // every IDX element type converts exactly
      if (static_cast<trainkit::index_t>(v.size()) != n) std::abort();
      // Integer targets only for integer files: a float/double NaN or 1e300 cast to an integer
      // type is undefined behaviour in the caller's choice of T, not a malformed file.
      if (a.type != trainkit::data::idx_float && a.type != trainkit::data::idx_double)
        (void)a.to_vector<std::int64_t>();
    }
  } catch (const trainkit::error&) {
    // an expected rejection of a malformed file
  }
  return 0;
}
