// tests/fuzz/fuzz_cifar10.cpp - libFuzzer harness for the CIFAR-10 binary reader:
// data::read_cifar10_file (any file) and data::load_cifar10 (a split directory holding test_batch.bin).
//
// The readers take paths, so each input is written to test_batch.bin in a per-process temporary
// directory. A trainkit::error is an expected rejection; anything else (a crash, a sanitizer
// report, another exception type, a huge allocation) is a finding.
// Built and run by scripts/fuzz.sh; reproduce a finding with `build-fuzz/fuzz_cifar10 crash-<sha1>`.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "fuzz_files.hpp"  // scratch_dir, write_file
#include "trainkit/core/error.hpp"
#include "trainkit/data/cifar10.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > (std::size_t(1) << 20)) return 0;  // at most 341 records
  static const std::filesystem::path dir = fuzz::scratch_dir("cifar10");
  static const std::filesystem::path file = dir / "test_batch.bin";
  fuzz::write_file(file, data, size);
  namespace td = trainkit::data;
  const bool whole = size > 0 && size % td::cifar10_record_bytes == 0;
  try {
    const td::cifar10_file f = td::read_cifar10_file(file);
    if (!whole) std::abort();  // accepted a file that is not a whole number of records
    if (f.labels.size() * td::cifar10_image_bytes != f.pixels.size()) std::abort();
    for (std::uint8_t l : f.labels)
      if (l >= td::cifar10_classes) std::abort();
  } catch (const trainkit::error&) {
  }
  try {
    // The expected-count check, with a count taken from the input.
    const trainkit::index_t expected = size ? data[0] % 4 : 0;
    (void)td::read_cifar10_file(file, expected);
  } catch (const trainkit::error&) {
  }
  try {
    td::cifar10_options opts;
    if (size > 1) opts.limit = data[1] % 8;
    const auto ds = td::load_cifar10<float>(dir, td::split::test, opts);
    const trainkit::index_t n = ds.labels.numel();
    if (ds.images.numel() != n * static_cast<trainkit::index_t>(td::cifar10_image_bytes)) std::abort();
    const float* px = ds.images.data();
    for (trainkit::index_t i = 0; i < ds.images.numel(); ++i)
      if (!(px[i] >= 0.0f && px[i] <= 1.0f)) std::abort();
  } catch (const trainkit::error&) {
  }
  return 0;
}
