// tests/support/cpu.hpp - tests of what depends on the CPU: a case that needs a kernel this CPU (or
// its ISA limit, TRAINKIT_MAX_CPU_ISA / ONEDNN_MAX_CPU_ISA) lacks says so in the output and returns.
#pragma once

#include <catch2/catch.hpp>

#include "trainkit/backend/cpu/cpu_features.hpp"

/// Ends the enclosing test case, with a visible "SKIPPED: <what>; <the CPU>" warning, unless `cond`.
#define TRAINKIT_SKIP_UNLESS(cond, what)                                                                 \
  do {                                                                                                  \
    if (!(cond)) {                                                                                      \
      WARN("SKIPPED: " << what << " (" << ::trainkit::backend::cpu_features::describe() << ")");       \
      return;                                                                                           \
    }                                                                                                   \
  } while (false)
