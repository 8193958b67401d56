// examples/common/example.hpp - the little each example needs besides trainkit itself:
// command-line flags, a timer, the parameters digest, the choice of run_monitor and the figures it
// logs every --log-every steps. Kept out of the library on purpose.
#pragma once

#include <charconv>  // std::from_chars: whole-string number parsing
#include <chrono>
#include <cmath>  // std::isfinite
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>  // interval_log's sum over the ranks
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>  // std::errc
#include <utility>
#include <vector>

#include <trainkit/trainkit.hpp>
#if TRAINKIT_EXAMPLE_HTTP  // set by examples/CMakeLists.txt when trainkit::monitor_http is linked
#include <trainkit/monitor/http_exporter.hpp>  // run_monitor: /metrics over HTTP (cpp-httplib)
#endif

namespace example {

/// What each flag of the examples does and which values it takes, for --help. Every flag an
/// example declares has a line here (a flag without one is a std::logic_error at start-up).
inline const std::map<std::string, std::string>& flag_help() {
  static const std::map<std::string, std::string> help = {
      {"batch", "samples per step (per rank when data-parallel)"},
      {"clip", "clip the gradients' total 2-norm to this (0: no clipping)"},
      {"context", "tokens (characters) per training window; the model's longest input"},
      {"checkpoint", "recompute activations in backward: none, sqrt (sqrt(n) segments) or every:N"},
      {"comm", "gradient transport between GPUs: nccl, or mpi (staged through pinned host memory)"},
      {"compression", "gradient compression: none, fp16, bf16, int8, sign_1bit (1bit); lossy ones with error feedback"},
      {"data", "directory of the Fashion-MNIST *-ubyte.gz files (the resnet: or CIFAR-10's binary batches)"},
      {"dropout", "dropout probability in attention, after the MLP and on the embeddings (training only)"},
      {"embd", "width of the model: embedding and residual stream"},
      {"epochs", "passes over the training set"},
      {"eval-every", "steps between validation passes (the loss in nats per character)"},
      {"heads", "attention heads per layer (must divide --embd)"},
      {"hierarchical", "1: fp32 among the ranks of a host, --compression only between hosts; 0: flat"},
      {"log-every", "steps between log points (steps N, 2N, ... of the run): --metrics-log and --tensorboard "
                    "write, and the progress line shows, the mean loss and samples/s of those N steps"},
      {"layers", "transformer blocks"},
      {"lr", "peak learning rate, reached at the end of the warmup, then a cosine decay"},
      {"metrics-log", "append the metrics as JSON lines to this file every --log-every steps (empty: off)"},
      {"metrics-port", "serve Prometheus metrics on /metrics at this port, rank r at port + r (0: off)"},
      {"overlap", "1: reduce gradient buckets while backward runs; 0: all in finish(), to compare"},
      {"precision", "fp32, bf16 or fp16: linear and conv layers in 16 bits, fp32 master weights"},
      {"resume", "0: start afresh; 1: continue from the newest good snapshot (an error if none); auto: "
                 "continue if there is one"},
      {"sample-chars", "characters generated from the trained model at the end (0: none)"},
      {"seed", "seed of every random stream: initialisation, data order, dropout"},
      {"snapshot-dir", "keep the whole training state here (empty: off); SIGTERM/SIGINT write one and exit 75"},
      {"snapshot-every", "steps between periodic snapshots"},
      {"steps", "optimizer steps of the whole run (the schedule's length)"},
      {"stop-after", "stop as a signal would (snapshot, exit 75) after this many steps of this run; 0: never"},
      {"tensorboard", "write the metrics every --log-every steps and the test accuracy each epoch as TensorBoard "
                      "scalars to this directory (empty: off)"},
      {"text", "the training text: files joined in order, separated by commas (90 % train, 10 % validate)"},
      {"test-limit", "score only the first N test images (0: all)"},
      {"tf32", "1: fp32 GEMMs and convolutions may use TF32 tensor cores (GPU)"},
      {"train-limit", "train on the first N training images only (0: all)"},
      {"weight-decay", "decoupled (AdamW) weight decay of the weight matrices; biases and norms get none"},
      {"width", "channels of the network's first stage"},
  };
  return help;
}

/// --name value flags (and bare --flag for booleans); unknown flags are an error, so a typo
/// does not silently train with defaults. Numbers are parsed strictly (the whole value, in range):
///   f.num("epochs", 1)           an integer >= 1      "--epochs: expected an integer >= 1, got '-1'"
///   f.num("resume", 0, 1)        0 or 1
///   f.real("lr", 0)              a finite number >= 0
/// and each error is a std::invalid_argument naming the flag and the value.
class flags {
 public:
  flags(int argc, char** argv, std::map<std::string, std::string> defaults) : values_(std::move(defaults)) {
    for (const auto& [k, v] : values_)
      if (!flag_help().count(k)) throw std::logic_error("example::flags: --" + k + " has no line in flag_help()");
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::cout << "flags (default in brackets):\n";
        for (auto& [k, v] : values_)
          std::cout << "  --" << k << " [" << (v.empty() ? "\"\"" : v) << "]\n      " << flag_help().at(k) << "\n";
        std::exit(0);
      }
      if (a.rfind("--", 0) != 0) throw std::invalid_argument("unexpected argument '" + a + "'");
      a = a.substr(2);
      std::string v = "1";
      if (auto eq = a.find('='); eq != std::string::npos) {
        v = a.substr(eq + 1);
        a = a.substr(0, eq);
      } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        v = argv[++i];
      }
      if (!values_.count(a)) throw std::invalid_argument("unknown flag --" + a + " (see --help)");
      values_[a] = v;
    }
  }
  std::string str(const std::string& k) const { return values_.at(k); }
  /// The integer value of --k, which must lie in [min, max].
  long num(const std::string& k, long min = std::numeric_limits<long>::min(),
           long max = std::numeric_limits<long>::max()) const {
    const std::string& v = values_.at(k);
    long x = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec == std::errc::result_out_of_range) fail(k, "an integer that fits in a long", v);
    if (ec != std::errc() || end != v.data() + v.size()) fail(k, "an integer" + range(min, max), v);
    if (x < min || x > max) fail(k, "an integer" + range(min, max), v);
    return x;
  }
  /// The value of --k as a finite number in [min, max].
  double real(const std::string& k, double min = -std::numeric_limits<double>::infinity(),
              double max = std::numeric_limits<double>::infinity()) const {
    const std::string& v = values_.at(k);
    double x = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc() || end != v.data() + v.size() || !std::isfinite(x) || x < min || x > max)
      fail(k, "a finite number" + range(min, max), v);
    return x;
  }

 private:
  [[noreturn]] static void fail(const std::string& k, const std::string& expected, const std::string& v) {
    throw std::invalid_argument("--" + k + ": expected " + expected + ", got '" + v + "'");
  }
  /// " >= 1", " in [0, 1]" or "" for the bounds that are set.
  template <class T>
  static std::string range(T min, T max) {
    // The defaults (no bound) are the extremes of T: infinities for a double, lowest/max for a long.
    constexpr T none_lo = std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                               : std::numeric_limits<T>::lowest();
    constexpr T none_hi = std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity()
                                                               : std::numeric_limits<T>::max();
    const bool lo = min > none_lo, hi = max < none_hi;
    std::ostringstream os;
    if (lo && hi)
      os << " in [" << min << ", " << max << "]";
    else if (lo)
      os << " >= " << min;
    else if (hi)
      os << " <= " << max;
    return os.str();
  }

  std::map<std::string, std::string> values_;
};

/// --metrics-port and --metrics-log: the library's run_monitor, with the /metrics endpoint where
/// trainkit::monitor_http is linked; without it a port is a clear error and the log still works.
#if TRAINKIT_EXAMPLE_HTTP
using run_monitor = trainkit::monitor::run_monitor;
#else
using run_monitor = trainkit::monitor::basic_run_monitor<>;
#endif

/// The exit status that asks a scheduler to run the job again (sysexits.h EX_TEMPFAIL): a stop
/// signal arrived (snapshot written) or a peer rank failed. 1 stays for the user's own errors.
inline constexpr int exit_restart = 75;

/// One start-up line: the threads each process runs and where that number came from
/// (TRAINKIT_THREAD_DEFAULTS() in each example's main file; trainkit/core/threads.hpp), and what
/// decides how long idle workers spin (trainkit/core/wait_governor.hpp).
inline std::string threads_line() {
  const trainkit::thread_settings t = trainkit::thread_defaults();
  const trainkit::wait_status w = trainkit::wait_policy();
  std::ostringstream s;
  s << "threads: " << (t.threads > 0 ? std::to_string(t.threads) : std::string("runtime default")) << " per process";
  if (t.threads_set_here)
    s << " (" << t.cores << " cores / " << t.local_ranks << " local rank" << (t.local_ranks > 1 ? "s" : "") << ")";
  else if (t.threads > 0)
    s << " (OMP_NUM_THREADS)";
  s << ", wait: " << trainkit::to_string(w.mode);
  if (w.mode == trainkit::wait_mode::adaptive)
    s << " (spin; sleep while " << w.reason << " shows the CPUs contended)";
  else if (!w.reason.empty())
    s << " (" << w.reason << ")";
  return s.str();
}

/// One closing line, where the wait governor is adaptive: how much of the run it throttled.
inline std::string wait_line() {
  const trainkit::wait_status w = trainkit::wait_policy();
  if (w.mode != trainkit::wait_mode::adaptive) return {};
  std::ostringstream s;
  s << "wait: slept in " << w.sleeping_windows << " of " << w.windows << " windows of 100 ms (CPU pressure), "
    << w.switches << " switch" << (w.switches == 1 ? "" : "es");
  return s.str();
}

/// printf on rank 0 only (rank 0 speaks for a data-parallel job), flushed at once.
template <class... A>
void say(int rank, const char* fmt, A... args) {
  if (rank != 0) return;
  std::printf(fmt, args...);
  std::fflush(stdout);
}

/// Seconds since construction.
class stopwatch {
 public:
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

/// --log-every N: every N steps of the run (steps N, 2N, ..., counted across epochs), the figures of
/// those steps go to the logs (monitor.log: --metrics-log, --tensorboard, with every other metric as
/// the registry holds it) and to the progress line:
///   loss       the mean over the interval's samples: each step's loss weighted by its batch, so with
///              equal batches the mean of the N losses (the epoch line's loss is the same over the epoch)
///   samples/s  the interval's samples over its training time (evaluation between epochs not counted)
/// After a resume, the first interval holds the steps since the resume. A step's loss stays where it
/// was computed: on a GPU the interval's sum grows on the device and is read once per interval, and
/// only when `watched` (someone reads the figures). `sum_over_ranks`, for data-parallel jobs, adds
/// the ranks' sums (every rank calls step_done() at the same steps): the figures are then the job's.
/// \tparam Device where a loss given as a tensor is summed (trainkit::cpu or trainkit::cuda)
template <class Device = trainkit::cpu>
class interval_log {
 public:
  interval_log(run_monitor& monitor, long every, bool watched = true,
               std::function<void(double* sums, int n)> sum_over_ranks = {})
      : monitor_(monitor), every_(every), watched_(watched), sum_over_ranks_(std::move(sum_over_ranks)) {}

  /// Before each epoch's steps: the time since the last step (evaluation) is not training time.
  void start() { last_ = std::chrono::steady_clock::now(); }

  /// One step's loss, read already, and its samples.
  void add(double loss, trainkit::index_t samples) {
    host_sum_ += loss * double(samples);
    samples_ += samples;
  }
  /// One step's loss where it was computed (a 0-d tensor: summed there, nothing read), and its samples.
  void add(const trainkit::tensor<float, Device>& loss, trainkit::index_t samples) {
    trainkit::add_(device_sum_, loss, double(samples));
    on_device_ = true;
    samples_ += samples;
  }

  /// After step `step` of the run (from 1) in epoch `epoch` (from 1): at every N-th step, writes
  /// the interval's figures and returns its mean loss (for the progress line); NaN at other steps
  /// and when not watched.
  double step_done(std::int64_t step, std::int64_t epoch) {
    const auto now = std::chrono::steady_clock::now();
    seconds_ += std::chrono::duration<double>(now - last_).count();
    last_ = now;
    if (step % every_ != 0) return std::numeric_limits<double>::quiet_NaN();
    double mean = std::numeric_limits<double>::quiet_NaN(), rate = mean;
    if (watched_) {
      double sums[2] = {host_sum_ + (on_device_ ? double(device_sum_.item()) : 0.0), double(samples_)};
      if (sum_over_ranks_) sum_over_ranks_(sums, 2);
      if (sums[1] > 0) mean = sums[0] / sums[1];
      if (seconds_ > 0) rate = sums[1] / seconds_;
    }
    monitor_.metrics().set_interval(mean, rate);
    monitor_.log(step, epoch);
    host_sum_ = seconds_ = 0;
    samples_ = 0;
    if (on_device_) trainkit::fill_(device_sum_, 0.0f);
    return mean;
  }

 private:
  run_monitor& monitor_;
  long every_;
  bool watched_;
  std::function<void(double*, int)> sum_over_ranks_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  double host_sum_ = 0, seconds_ = 0;
  trainkit::index_t samples_ = 0;
  trainkit::tensor<float, Device> device_sum_ = trainkit::tensor<float, Device>::zeros({});
  bool on_device_ = false;
};

/// FNV-1a over the bytes of every parameter and buffer (state_dict order): equal digests mean
/// bit-identical models, e.g. a run that was interrupted and resumed against one that was not.
inline std::uint64_t fnv1a(std::uint64_t h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}
inline constexpr std::uint64_t fnv1a_basis = 1469598103934665603ull;

template <class Model>
std::uint64_t digest(const Model& model) {
  std::uint64_t h = fnv1a_basis;
  for (const auto& [name, t] : model.state_dict()) {
    const auto c = t.template to<trainkit::cpu>().contiguous();  // a CUDA model's too
    h = fnv1a(h, c.data(), static_cast<std::size_t>(c.numel()) * sizeof(*c.data()));
  }
  return h;
}

/// The model's structure for the snapshot's run_config: its parameter count and an FNV-1a digest
/// of every parameter's and buffer's name and shape (not the values), so that a resume into
/// another architecture is named as such before any tensor is read.
template <class Model>
std::string signature(const Model& model) {
  std::uint64_t h = fnv1a_basis;
  for (const auto& [name, t] : model.state_dict()) {
    const std::string entry = name + trainkit::to_string(t.sizes()) + ";";
    h = fnv1a(h, entry.data(), entry.size());
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%lld parameters, layout %016llx", static_cast<long long>(model.num_parameters()),
                static_cast<unsigned long long>(h));
  return buf;
}

/// What changes a run's trajectory, for resumable_run_options::config: recorded in every snapshot
/// and compared on resume (a difference is an error with --resume 1, a warning with auto).
/// `more`: the program's own (precision; world size and compression under DDP).
template <class Model>
std::vector<std::pair<std::string, std::string>> run_config(const flags& f, const Model& model,
                                                            std::vector<std::pair<std::string, std::string>> more = {}) {
  std::vector<std::pair<std::string, std::string>> c = {
      {"batch", f.str("batch")},   {"seed", f.str("seed")},
      {"lr", f.str("lr")},         {"epochs", f.str("epochs")},
      {"train_limit", f.str("train-limit")}, {"model", signature(model)}};
  for (auto& kv : more) c.push_back(std::move(kv));
  return c;
}

/// --resume: 0 (start over), 1 (a usable snapshot must be in --snapshot-dir) or auto (resume if
/// there is one: for jobs a scheduler requeues). A bare --resume is 1.
inline trainkit::io::resume_mode resume_flag(const flags& f) {
  const std::string v = f.str("resume");
  if (v == "0") return trainkit::io::resume_mode::off;
  if (v == "1") return trainkit::io::resume_mode::required;
  if (v == "auto") return trainkit::io::resume_mode::if_present;
  throw std::invalid_argument("--resume: expected 0, 1 or auto, got '" + v + "'");
}

}  // namespace example
