// tests/consumer/main.cpp - what a user's first program sees: the umbrella header and its
// dependencies' usage requirements (include paths, libraries, -fopenmp) coming from the package.
//
// The first line of output must be "trainkit <major>.<minor>.<patch>" (the package tests compare it
// with the CMake project version).
#if __has_include(<trainkit/trainkit.hpp>)
#include <trainkit/trainkit.hpp>
#else
// Until the umbrella exists, the lightest headers; switch to the umbrella only when it is there.
#include <trainkit/config.hpp>
#include <trainkit/core/error.hpp>
#endif

#include <cblas.h>  // from trainkit::cblas: the include dir of OpenBLAS's cblas.h travels with the target
#include <zlib.h>   // ZLIB::ZLIB

#include <cstdio>

int main() {
  std::printf("trainkit %d.%d.%d\n", TRAINKIT_VERSION_MAJOR, TRAINKIT_VERSION_MINOR, TRAINKIT_VERSION_PATCH);

  // Linked, not only found: one call into each dependency.
  const float x[3] = {1.0f, 2.0f, 3.0f};
  const float y[3] = {4.0f, 5.0f, 6.0f};
  const float dot = cblas_sdot(3, x, 1, y, 1);
  std::printf("cblas_sdot = %g, zlib %s, openmp %s, onednn %s\n", static_cast<double>(dot), zlibVersion(),
#if defined(_OPENMP)
              "on",
#else
              "off",
#endif
#if defined(TRAINKIT_HAS_ONEDNN) && TRAINKIT_HAS_ONEDNN
              "on"
#else
              "off"
#endif
  );
  // trainkit's own error type, which every component throws.
  try {
    throw trainkit::value_error("consumer: expected");
  } catch (const trainkit::error&) {
  }
  return dot == 32.0f ? 0 : 1;
}
