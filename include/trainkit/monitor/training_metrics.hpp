// trainkit/monitor/training_metrics.hpp - the standard figures of a training run as Prometheus
// metrics, fed once per step from a step_figures record (train::train_step does it for you).
//
//   monitor::registry reg;
//   monitor::training_metrics metrics(reg);
//   ... each step:
//   metrics.observe({.seconds = dt, .samples = batch, .loss = loss, .learning_rate = opt.lr()});
//
// The families (names and units by the Prometheus conventions: base units, _total for counters):
//   trainkit_steps_total                   counter    optimizer steps attempted
//   trainkit_samples_total                 counter    samples trained on
//   trainkit_step_duration_seconds         histogram  wall time of one step
//   trainkit_samples_per_second            gauge      throughput of the last step (or interval: set_interval)
//   trainkit_loss                          gauge      loss of the last step (or interval mean: set_interval)
//   trainkit_learning_rate                 gauge      learning rate of the last step
//   trainkit_loss_scale                    gauge      loss scale after the last step
//   trainkit_grad_norm                     gauge      total 2-norm of the gradients, last step that measured it
//   trainkit_skipped_steps_total           counter    steps skipped for inf/NaN gradients
//   trainkit_epoch                         gauge      current epoch
//   trainkit_communication_seconds_total   counter    time spent in gradient communication
//   trainkit_communication_time_ratio      gauge      communication time / step time, last step (0..1)
//   trainkit_bytes_sent_total              counter    bytes this rank put on the wire
//   trainkit_data_wait_seconds_total       counter    time the step waited for its batch
//   trainkit_memory_allocated_bytes        gauge      device="cpu": bytes held by live tensors
//   trainkit_memory_peak_bytes             gauge      device="cpu": highest allocated so far
//   trainkit_memory_reserved_bytes         gauge      device="cpu": bytes held from the system
// and the same three for every device added with track_memory() (device="cuda": the caching
// allocator's figures - `metrics.track_memory("cuda", [] { return allocator<cuda>::stats(); })`),
// plus, where NVML is present, the trainkit_gpu_* gauges of monitor/nvml.hpp.
#pragma once

#include <cmath>  // NAN, std::isnan
#include <cstdint>
#include <functional>  // track_memory's reader
#include <limits>
#include <string>
#include <vector>

#include "trainkit/core/allocator.hpp"
#include "trainkit/core/device.hpp"
#include "trainkit/monitor/metrics.hpp"
#include "trainkit/monitor/nvml.hpp"

namespace trainkit::monitor {

/// What one step reports. Fields left NaN are not reported (their gauges keep their value);
/// counters take increments, not totals.
struct step_figures {
  double seconds = std::numeric_limits<double>::quiet_NaN();  ///< wall time of the step
  std::int64_t samples = 0;                                   ///< batch size
  double loss = std::numeric_limits<double>::quiet_NaN();
  double learning_rate = std::numeric_limits<double>::quiet_NaN();
  double loss_scale = std::numeric_limits<double>::quiet_NaN();
  bool skipped = false;                ///< the optimizer step was skipped (inf/NaN gradients)
  double communication_seconds = 0.0;  ///< this step's gradient communication
  std::uint64_t bytes_sent = 0;        ///< this step's bytes on the wire
  double data_wait_seconds = 0.0;      ///< this step's wait for data
  double grad_norm = std::numeric_limits<double>::quiet_NaN();  ///< gradients' total 2-norm (NaN: not measured)
};

/// Settings of training_metrics.
struct training_metrics_options {
  std::vector<double> step_buckets = exponential_buckets(1e-3, 2.0, 16);  ///< 1 ms .. 33 s
  bool gpu = true;  ///< export the NVML gauges when NVML is present
};

/// The standard metric families in a registry, and their update per step.
class training_metrics {
 public:
  explicit training_metrics(registry& reg, const training_metrics_options& o = {})
      : reg_(&reg),
        steps_(reg.counter("trainkit_steps_total", "Optimizer steps attempted.")),
        samples_(reg.counter("trainkit_samples_total", "Samples trained on.")),
        step_seconds_(reg.histogram("trainkit_step_duration_seconds", "Wall time of one training step.",
                                    o.step_buckets)),
        throughput_(reg.gauge("trainkit_samples_per_second", "Training throughput of the last step.")),
        loss_(reg.gauge("trainkit_loss", "Training loss of the last step.")),
        lr_(reg.gauge("trainkit_learning_rate", "Learning rate of the last step.")),
        scale_(reg.gauge("trainkit_loss_scale", "Loss scale after the last step (1 without scaling).")),
        grad_norm_(reg.gauge("trainkit_grad_norm", "Total 2-norm of the gradients, last step that measured it.")),
        skipped_(
            reg.counter("trainkit_skipped_steps_total", "Steps skipped because a gradient was inf or NaN.")),
        epoch_(reg.gauge("trainkit_epoch", "Current epoch.")),
        comm_seconds_(
            reg.counter("trainkit_communication_seconds_total", "Time spent in gradient communication.")),
        comm_ratio_(reg.gauge("trainkit_communication_time_ratio",
                              "Gradient communication time over step time, last step (0..1).")),
        bytes_sent_(
            reg.counter("trainkit_bytes_sent_total", "Bytes this rank sent in gradient communication.")),
        data_wait_(
            reg.counter("trainkit_data_wait_seconds_total", "Time the training step waited for its batch.")),
        allocated_(
            reg.gauge("trainkit_memory_allocated_bytes", "Bytes held by live tensors.", {{"device", "cpu"}})),
        peak_(
            reg.gauge("trainkit_memory_peak_bytes", "Highest allocated bytes so far.", {{"device", "cpu"}})),
        reserved_(reg.gauge("trainkit_memory_reserved_bytes", "Bytes held from the system (cached included).",
                            {{"device", "cpu"}})) {
    scale_.set(1.0);
    grad_norm_.set(std::numeric_limits<double>::quiet_NaN());  // not measured yet (no clipping)
    // Memory figures are read when scraped, so they are current even between steps. The hook
    // holds the gauges (owned by the registry), not this object, which may go first.
    reg.on_collect([a = &allocated_, p = &peak_, r = &reserved_] { read_memory(allocator<cpu>::stats(), *a, *p, *r); });
    if (o.gpu) gpu_ = export_gpu_metrics(reg);
  }
  training_metrics(const training_metrics&) = delete;
  training_metrics& operator=(const training_metrics&) = delete;

  /// Records one step.
  void observe(const step_figures& f) {
    steps_.inc();
    if (f.samples > 0) samples_.inc(static_cast<double>(f.samples));
    if (!std::isnan(f.seconds)) {
      step_seconds_.observe(f.seconds);
      if (f.seconds > 0 && f.samples > 0) throughput_.set(static_cast<double>(f.samples) / f.seconds);
      if (f.seconds > 0) comm_ratio_.set(f.communication_seconds / f.seconds);
    }
    if (!std::isnan(f.loss)) loss_.set(f.loss);
    if (!std::isnan(f.learning_rate)) lr_.set(f.learning_rate);
    if (!std::isnan(f.loss_scale)) scale_.set(f.loss_scale);
    if (!std::isnan(f.grad_norm)) grad_norm_.set(f.grad_norm);
    if (f.skipped) skipped_.inc();
    if (f.communication_seconds > 0) comm_seconds_.inc(f.communication_seconds);
    if (f.bytes_sent > 0) bytes_sent_.inc(static_cast<double>(f.bytes_sent));
    if (f.data_wait_seconds > 0) data_wait_.inc(f.data_wait_seconds);
    read_memory(allocator<cpu>::stats(), allocated_, peak_, reserved_);
  }
  /// Exports the allocated / reserved / peak bytes of another device's allocator, labelled
  /// device=`device`, read at every exposition (e.g. "cuda" and allocator<cuda>::stats, from CUDA code).
  void track_memory(const std::string& device, std::function<memory_stats()> read) {
    gauge& a = reg_->gauge("trainkit_memory_allocated_bytes", "Bytes held by live tensors.", {{"device", device}});
    gauge& p = reg_->gauge("trainkit_memory_peak_bytes", "Highest allocated bytes so far.", {{"device", device}});
    gauge& r = reg_->gauge("trainkit_memory_reserved_bytes", "Bytes held from the system (cached included).",
                           {{"device", device}});
    reg_->on_collect([&a, &p, &r, read = std::move(read)] { read_memory(read(), a, p, r); });
  }
  /// Sets the loss and throughput gauges to figures over several steps - the mean loss and the
  /// samples per second of the interval since the previous log line (the examples' --log-every) -
  /// so that a log written now shows those rather than the last step's; the next observe() with a
  /// loss or a step time sets them again. NaN leaves a gauge as it is.
  void set_interval(double mean_loss, double samples_per_second) {
    if (!std::isnan(mean_loss)) loss_.set(mean_loss);
    if (!std::isnan(samples_per_second)) throughput_.set(samples_per_second);
  }
  void set_epoch(std::int64_t e) { epoch_.set(static_cast<double>(e)); }
  /// Time waited for a batch outside observe() (a loader's next()).
  void add_data_wait(double seconds) {
    if (seconds > 0) data_wait_.inc(seconds);
  }

  registry& metrics_registry() noexcept { return *reg_; }
  /// Whether the GPU gauges are exported (NVML found).
  bool gpu_metrics() const noexcept { return gpu_; }
  double steps() const noexcept { return steps_.value(); }

 private:
  static void read_memory(const memory_stats& s, gauge& allocated, gauge& peak, gauge& reserved) {
    allocated.set(static_cast<double>(s.allocated));
    peak.set(static_cast<double>(s.peak));
    reserved.set(static_cast<double>(s.reserved));
  }

  registry* reg_;
  counter& steps_;
  counter& samples_;
  histogram& step_seconds_;
  gauge& throughput_;
  gauge& loss_;
  gauge& lr_;
  gauge& scale_;
  gauge& grad_norm_;
  counter& skipped_;
  gauge& epoch_;
  counter& comm_seconds_;
  gauge& comm_ratio_;
  counter& bytes_sent_;
  counter& data_wait_;
  gauge& allocated_;
  gauge& peak_;
  gauge& reserved_;
  bool gpu_ = false;
};

}  // namespace trainkit::monitor
