// trainkit/monitor/monitor.hpp - umbrella of monitoring: metrics and their registry, the
// Prometheus text format, JSON lines, TensorBoard event files, the standard training metrics, the
// NVML GPU gauges and basic_run_monitor. The HTTP exporter is separate (<trainkit/monitor/http_exporter.hpp>, with
// monitor::run_monitor = basic_run_monitor<http_exporter>): it needs cpp-httplib.
#pragma once

#include "trainkit/monitor/jsonl_logger.hpp"      // jsonl_logger, to_json_line
#include "trainkit/monitor/metrics.hpp"           // counter, gauge, histogram, registry, *_buckets
#include "trainkit/monitor/progress.hpp"          // progress_line: the live line while an epoch runs
#include "trainkit/monitor/nvml.hpp"              // nvml, export_gpu_metrics
#include "trainkit/monitor/prometheus.hpp"        // to_prometheus, prometheus_content_type
#include "trainkit/monitor/run_monitor.hpp"       // basic_run_monitor, run_monitor_options, http_exporter_options
#include "trainkit/monitor/tensorboard.hpp"       // tensorboard_writer, tensorboard_logger, crc32c
#include "trainkit/monitor/training_metrics.hpp"  // training_metrics, step_figures
