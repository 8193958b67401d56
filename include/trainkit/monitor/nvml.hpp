// trainkit/monitor/nvml.hpp - GPU utilisation, memory and temperature through NVML, loaded at run
// time with dlopen("libnvidia-ml.so.1"): no NVML headers or libraries at build time, and on a
// machine without the NVIDIA driver the GPU gauges are simply not exported.
//
//   monitor::registry reg;
//   if (monitor::export_gpu_metrics(reg)) ...   // trainkit_gpu_* gauges, one child per GPU
//
// Gauges (label gpu="<index>"), refreshed at every exposition:
//   trainkit_gpu_utilization_ratio        share of the last sample period a kernel ran (0..1)
//   trainkit_gpu_memory_used_bytes        device memory in use (all processes)
//   trainkit_gpu_memory_total_bytes       device memory
//   trainkit_gpu_temperature_celsius      core temperature
//   trainkit_gpu_power_watts              board power draw
#pragma once

#include <dlfcn.h>  // dlopen, dlsym, dlclose (POSIX; in glibc's libc since 2.34, else link ${CMAKE_DL_LIBS})

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainkit/monitor/metrics.hpp"

namespace trainkit::monitor {

/// One reading of one GPU (a field NVML could not give is negative).
struct gpu_sample {
  double utilization = -1.0;  ///< 0..1
  double memory_used_bytes = -1.0;
  double memory_total_bytes = -1.0;
  double temperature_celsius = -1.0;
  double power_watts = -1.0;
};

/// Where NVML is looked for.
struct nvml_options {
  std::string library = "libnvidia-ml.so.1";
};

/// The NVML functions this library calls, resolved with dlsym. Not copyable; the library is
/// shut down and unloaded on destruction.
class nvml {
 public:
  explicit nvml(const nvml_options& o = {}) {
    handle_ = ::dlopen(o.library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) return;
    const bool ok = sym(init_, "nvmlInit_v2") && sym(shutdown_, "nvmlShutdown") &&
                    sym(count_, "nvmlDeviceGetCount_v2") &&
                    sym(handle_by_index_, "nvmlDeviceGetHandleByIndex_v2") &&
                    sym(utilization_, "nvmlDeviceGetUtilizationRates") &&
                    sym(memory_, "nvmlDeviceGetMemoryInfo") && sym(temperature_, "nvmlDeviceGetTemperature");
    (void)sym(power_, "nvmlDeviceGetPowerUsage");  // optional
    if (!ok || init_() != success) {
      ::dlclose(handle_);
      handle_ = nullptr;
      return;
    }
    initialised_ = true;
    unsigned n = 0;
    if (count_(&n) == success) {
      for (unsigned i = 0; i < n; ++i) {
        device_t d = nullptr;
        if (handle_by_index_(i, &d) == success) devices_.push_back(d);
      }
    }
  }
  nvml(const nvml&) = delete;
  nvml& operator=(const nvml&) = delete;
  ~nvml() {
    if (initialised_) shutdown_();
    if (handle_) ::dlclose(handle_);
  }

  /// Whether the library loaded and initialised.
  bool available() const noexcept { return initialised_; }
  std::size_t device_count() const noexcept { return devices_.size(); }

  /// The current figures of GPU i (i < device_count()).
  gpu_sample sample(std::size_t i) const {
    gpu_sample s;
    if (i >= devices_.size()) return s;
    device_t d = devices_[i];
    utilization_t u{};
    if (utilization_(d, &u) == success) s.utilization = static_cast<double>(u.gpu) / 100.0;
    memory_t m{};
    if (memory_(d, &m) == success) {
      s.memory_used_bytes = static_cast<double>(m.used);
      s.memory_total_bytes = static_cast<double>(m.total);
    }
    unsigned t = 0;
    if (temperature_(d, temperature_gpu, &t) == success) s.temperature_celsius = static_cast<double>(t);
    unsigned mw = 0;
    if (power_ && power_(d, &mw) == success) s.power_watts = static_cast<double>(mw) / 1000.0;
    return s;
  }

 private:
  // The few NVML declarations needed, written from its documented C API (nvml.h): every call
  // returns nvmlReturn_t (an int-sized enum, NVML_SUCCESS = 0); devices are opaque handles.
  using return_t = int;
  using device_t = struct nvml_device_opaque*;
  struct utilization_t {   // nvmlUtilization_t
    unsigned gpu, memory;  // percent
  };
  struct memory_t {  // nvmlMemory_t
    unsigned long long total, free, used;
  };
  static constexpr return_t success = 0;
  static constexpr int temperature_gpu = 0;  // NVML_TEMPERATURE_GPU

  template <class F>
  bool sym(F& f, const char* name) {
    void* p = ::dlsym(handle_, name);
    f = reinterpret_cast<F>(p);
    return p != nullptr;
  }

  void* handle_ = nullptr;
  bool initialised_ = false;
  return_t (*init_)() = nullptr;
  return_t (*shutdown_)() = nullptr;
  return_t (*count_)(unsigned*) = nullptr;
  return_t (*handle_by_index_)(unsigned, device_t*) = nullptr;
  return_t (*utilization_)(device_t, utilization_t*) = nullptr;
  return_t (*memory_)(device_t, memory_t*) = nullptr;
  return_t (*temperature_)(device_t, int, unsigned*) = nullptr;
  return_t (*power_)(device_t, unsigned*) = nullptr;
  std::vector<device_t> devices_;
};

/// Registers the trainkit_gpu_* gauges of every GPU NVML sees and refreshes them before each
/// exposition. Returns false, registering nothing, where NVML is not there.
inline bool export_gpu_metrics(registry& reg, const nvml_options& o = {}) {
  auto lib = std::make_shared<nvml>(o);
  if (!lib->available() || lib->device_count() == 0) return false;
  struct per_gpu {
    gauge *util, *used, *total, *temp, *power;
  };
  auto gauges = std::make_shared<std::vector<per_gpu>>();
  for (std::size_t i = 0; i < lib->device_count(); ++i) {
    const labels l{{"gpu", std::to_string(i)}};
    gauges->push_back({&reg.gauge("trainkit_gpu_utilization_ratio",
                                  "Share of time a kernel was running on the GPU (0..1).", l),
                       &reg.gauge("trainkit_gpu_memory_used_bytes", "GPU memory in use, all processes.", l),
                       &reg.gauge("trainkit_gpu_memory_total_bytes", "GPU memory.", l),
                       &reg.gauge("trainkit_gpu_temperature_celsius", "GPU core temperature.", l),
                       &reg.gauge("trainkit_gpu_power_watts", "GPU board power draw.", l)});
  }
  reg.on_collect([lib, gauges] {
    for (std::size_t i = 0; i < gauges->size(); ++i) {
      const gpu_sample s = lib->sample(i);
      const per_gpu& g = (*gauges)[i];
      if (s.utilization >= 0) g.util->set(s.utilization);
      if (s.memory_used_bytes >= 0) g.used->set(s.memory_used_bytes);
      if (s.memory_total_bytes >= 0) g.total->set(s.memory_total_bytes);
      if (s.temperature_celsius >= 0) g.temp->set(s.temperature_celsius);
      if (s.power_watts >= 0) g.power->set(s.power_watts);
    }
  });
  return true;
}

}  // namespace trainkit::monitor
