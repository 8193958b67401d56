// trainkit/core/threads.hpp - how many threads each process runs when cores are shared.
//
// The OpenMP runtime (libgomp) and OpenBLAS read OMP_NUM_THREADS once, while the program loads,
// before main() and before any constructor of the program's own code. Their default hurts the
// users trainkit is for: one thread per core in every process, so two ranks on a node each start
// all cores' worth of threads. (How long idle workers spin is decided while the program runs, with
// or without anything here: trainkit/core/wait_governor.hpp.)
//
// TRAINKIT_THREAD_DEFAULTS(), written once at namespace scope in the file that holds main(),
// adds to the environment what the user has not set:
//   OMP_NUM_THREADS=<n>         n = max(1, cores / local ranks): cores from this process's affinity
//                               mask (mpirun / srun binding included), local ranks from the
//                               launcher (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS,
//                               SLURM_NTASKS_PER_NODE); one process alone keeps every core
// Those runtimes read the environment before any code of the program runs, and glibc installs the
// environment only after the earliest hook a program has (its .preinit_array, which the dynamic
// loader runs before every shared library's constructors), where setenv() does not last. So the
// hook re-executes the program (/proc/self/exe, same pid, same arguments) with the variable
// added - once, before main(), before MPI or anything else has started; a marker variable
// (TRAINKIT_THREAD_DEFAULTS_SET) stops a second round and records what was added. A variable the
// user sets wins and costs no re-execution; TRAINKIT_THREAD_DEFAULTS=0 leaves everything alone.
// thread_defaults() says what is in effect, for a start-up line.
//
// Kernels too small to split already run serially (each CPU kernel family's grain: the elementwise
// loops below 32768 elements, GEMMs below 2^20 multiply-adds, ...), so a region's wake-up is paid
// only where the work pays for it.
#pragma once

#include <cstdio>   // std::snprintf
#include <cstdlib>  // std::getenv, std::strtol
#include <cstring>  // std::strstr
#include <initializer_list>

#if defined(__linux__)
#include <sched.h>  // sched_getaffinity, CPU_COUNT
#endif
#include <unistd.h>  // sysconf, execve, environ

namespace trainkit {

/// The thread settings in effect (see the top of this file).
struct thread_settings {
  int cores = 0;                 ///< CPUs in this process's affinity mask
  int local_ranks = 1;           ///< processes of this job on this host, per the launcher
  int threads = 0;               ///< OMP_NUM_THREADS (0: unset or not a plain number)
  bool passive = false;          ///< the user set OMP_WAIT_POLICY=passive
  bool threads_set_here = false; ///< OMP_NUM_THREADS was added by TRAINKIT_THREAD_DEFAULTS()
};

namespace detail {
/// The value of NAME in a NULL-terminated environment block (nullptr when absent).
inline const char* env_lookup(char* const* envp, const char* name) noexcept {
  if (envp == nullptr) return nullptr;
  for (; *envp != nullptr; ++envp) {
    const char* e = *envp;
    const char* n = name;
    while (*n != '\0' && *e == *n) ++e, ++n;
    if (*n == '\0' && *e == '=') return e + 1;
  }
  return nullptr;
}

inline int positive_int(const char* v) noexcept {
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (end != nullptr && *end == '\0' && n > 0 && n < (1 << 20)) ? int(n) : 0;
}

inline int affinity_cores() noexcept {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? int(n) : 1;
}

inline int launcher_local_ranks(char* const* envp) noexcept {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const int n = positive_int(env_lookup(envp, name))) return n;
  return 1;
}

inline bool env_set(char* const* envp, const char* name) noexcept {
  const char* v = env_lookup(envp, name);
  return v != nullptr && *v != '\0';
}

/// The .preinit_array hook of TRAINKIT_THREAD_DEFAULTS(). Allocates nothing (static buffers):
/// nothing but the loader has run yet.
inline void thread_defaults_preinit(int /*argc*/, char** argv, char** envp) noexcept {
  if (argv == nullptr || envp == nullptr) return;
  const char* off = env_lookup(envp, "TRAINKIT_THREAD_DEFAULTS");
  if (off != nullptr && off[0] == '0' && off[1] == '\0') return;
  if (env_lookup(envp, "TRAINKIT_THREAD_DEFAULTS_SET") != nullptr) return;  // the second round
  if (env_set(envp, "OMP_NUM_THREADS")) return;

  static char threads_var[48];
  static char marker_var[] = "TRAINKIT_THREAD_DEFAULTS_SET=OMP_NUM_THREADS";
  const int cores = affinity_cores(), local = launcher_local_ranks(envp);
  std::snprintf(threads_var, sizeof threads_var, "OMP_NUM_THREADS=%d", cores / local > 1 ? cores / local : 1);
  constexpr int capacity = 4096;
  static char* env[capacity];
  int n = 0;
  for (char** e = envp; *e != nullptr; ++e) {
    if (n >= capacity - 3) return;  // an environment this large: leave it alone
    env[n++] = *e;
  }
  env[n++] = threads_var;
  env[n++] = marker_var;
  env[n] = nullptr;
  ::execve("/proc/self/exe", argv, env);
  // Only reached when execve failed (no /proc): the runtimes' own defaults stay.
}
}  // namespace detail

/// The thread settings in effect: what the environment says now (after TRAINKIT_THREAD_DEFAULTS()
/// added its part), the cores and the launcher's local ranks.
inline thread_settings thread_defaults() noexcept {
  thread_settings s;
  s.cores = detail::affinity_cores();
  s.local_ranks = detail::launcher_local_ranks(::environ);
  s.threads = detail::positive_int(std::getenv("OMP_NUM_THREADS"));
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  s.passive = policy != nullptr && (policy[0] == 'p' || policy[0] == 'P');
  if (const char* set = std::getenv("TRAINKIT_THREAD_DEFAULTS_SET"))
    s.threads_set_here = std::strstr(set, "OMP_NUM_THREADS") != nullptr;
  return s;
}

}  // namespace trainkit

/// Once, at namespace scope, in the file that holds main() of an executable (a shared library
/// may not have a .preinit_array): OMP_NUM_THREADS=cores/local ranks where the environment does
/// not set it, before the OpenMP runtime and OpenBLAS read it.
#define TRAINKIT_THREAD_DEFAULTS()                                                             \
  [[gnu::used, gnu::section(".preinit_array")]] static void (*const trainkit_thread_defaults_entry)( \
      int, char**, char**) = &::trainkit::detail::thread_defaults_preinit
