// trainkit/dist/detail/timeout_env.hpp - TRAINKIT_DIST_TIMEOUT_MS, the job-wide override of the
// communicators' timeouts (a job script can tighten or loosen it without a rebuild), and the
// liveness probe's window derived from a timeout.
#pragma once

#include <algorithm>  // std::clamp
#include <charconv>  // std::from_chars
#include <chrono>
#include <cstdlib>  // std::getenv
#include <string_view>
#include <system_error>

#include "trainkit/core/error.hpp"

namespace trainkit::dist::detail {

/// The timeout in TRAINKIT_DIST_TIMEOUT_MS (milliseconds) if set, else `fallback`; a value that is not
/// a positive integer is a usage_error naming `where`.
inline std::chrono::milliseconds timeout_from_env(std::string_view where,
                                                  std::chrono::milliseconds fallback) {
  const char* env = std::getenv("TRAINKIT_DIST_TIMEOUT_MS");
  if (env == nullptr || *env == '\0') return fallback;
  long long ms = 0;
  const std::string_view s(env);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), ms);
  TRAINKIT_CHECK(ec == std::errc() && end == s.data() + s.size() && ms > 0, usage_error, where,
                 "TRAINKIT_DIST_TIMEOUT_MS must be a positive number of milliseconds, got '" << s << "'");
  return std::chrono::milliseconds(ms);
}

/// How long the liveness probe after a timeout waits for the peers' answers (mpi's own, and the
/// one dist::nccl borrows from its bootstrap): a quarter of the timeout, within [0.5 s, 3 s].
inline std::chrono::milliseconds probe_window(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 4, std::chrono::milliseconds(500), std::chrono::milliseconds(3000));
}

}  // namespace trainkit::dist::detail
