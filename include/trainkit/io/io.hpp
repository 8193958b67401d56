// trainkit/io/io.hpp - umbrella of snapshots: the file format, save_state/load_state, the
// training state, the snapshot directory, preemption handling and the resumable-run helper.
#pragma once

#include "trainkit/io/atomic_file.hpp"       // atomic_file, write_options
#include "trainkit/io/concepts.hpp"          // snapshottable, state_value, state_field_names
#include "trainkit/io/distributed.hpp"       // allgather_bytes_of, any_rank_of (data parallel)
#include "trainkit/io/format.hpp"            // format constants, record_kind, dtype_code
#include "trainkit/io/preemption.hpp"        // preemption_guard, snapshot_timer
#include "trainkit/io/resumable_run.hpp"     // resumable_run (--snapshot-dir, --resume)
#include "trainkit/io/snapshot.hpp"          // snapshot, snapshot_section
#include "trainkit/io/snapshot_manager.hpp"  // snapshot_manager (keep the last K, fall back)
#include "trainkit/io/state.hpp"             // save_state, load_state
#include "trainkit/io/training_state.hpp"    // training_state, run_progress
