# example_resume.cmake - ctest example_*_resume: an example on real data, killed with SIGKILL
# part-way through and resumed with --resume, must end with the same parameters digest as an
# uninterrupted run of the same seed.
#   cmake -DEXE=<example> -DDATA=<fashion-mnist dir> -DWORK=<scratch dir>
#         [-DLAUNCH=mpiexec|-np|2|...] [-DEXTRA=--compression|int8] -P example_resume.cmake
# LAUNCH (a '|'-separated prefix such as mpiexec -np 2) runs a data-parallel example; then every
# process of the job is killed (each rank's command line names the job's snapshot directory).
# The kill happens once the first periodic snapshot (every 5 steps) is on disk, while the job still
# has most of its steps to go; the script fails if the job had already finished by then (so the
# test cannot pass without a real interruption).
foreach(v EXE DATA WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "example_resume.cmake: -D${v}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
string(REPLACE "|" ";" LAUNCH "${LAUNCH}")
string(REPLACE "|" ";" EXTRA "${EXTRA}")
set(args --data "${DATA}" --epochs 2 --train-limit 3000 --test-limit 500 --seed 7 --snapshot-every 5 ${EXTRA})

function(digest_of out_var text)
  string(REGEX MATCH "parameters digest ([0-9a-f]+)" m "${text}")
  if(NOT m)
    message(FATAL_ERROR "no 'parameters digest' line in:\n${text}")
  endif()
  set(${out_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

# 1. The uninterrupted run.
execute_process(COMMAND ${LAUNCH} "${EXE}" ${args} --snapshot-dir "${WORK}/full"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "uninterrupted run failed (${rc}):\n${out}\n${err}")
endif()
digest_of(full "${out}")
message(STATUS "uninterrupted: ${full}")

# 2. The same job, SIGKILLed once its first snapshot exists. (A shell does the background job and
# the kill; execute_process cannot signal a child.)
set(sh [=[
"$@" > "$WORK/killed.log" 2>&1 &
pid=$!
for i in $(seq 1 6000); do
  ls "$WORK/killed"/*.tks >/dev/null 2>&1 && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.01
done
if ! kill -0 $pid 2>/dev/null; then echo "the job ended before it could be killed"; exit 1; fi
for p in $(pgrep -f -- "--snapshot-dir $WORK/killed"); do [ "$p" = "$$" ] || kill -9 "$p" 2>/dev/null; done
wait $pid; echo "killed: status $?"
]=])
# A job SIGKILLed whole, mpirun included, cannot remove Open MPI's session directory and shared-memory
# segments: they go to the scratch directory (removed by the next run), not to /tmp and /dev/shm.
file(MAKE_DIRECTORY "${WORK}/ompi")
execute_process(COMMAND env "WORK=${WORK}" "OMPI_MCA_orte_tmpdir_base=${WORK}/ompi"
                    "OMPI_MCA_btl_vader_backing_directory=${WORK}/ompi"
                    sh -c "${sh}" sh ${LAUNCH} "${EXE}" ${args} --snapshot-dir "${WORK}/killed"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kill phase: ${out}${err}")
endif()
message(STATUS "${out}")

# 3. Resume it to the end.
execute_process(COMMAND ${LAUNCH} "${EXE}" ${args} --snapshot-dir "${WORK}/killed" --resume
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "resumed run failed (${rc}):\n${out}\n${err}")
endif()
if(NOT err MATCHES "resumed from")
  message(FATAL_ERROR "the resumed run did not resume:\n${err}")
endif()
digest_of(resumed "${out}")
message(STATUS "resumed (${err}): ${resumed}")
if(NOT full STREQUAL resumed)
  message(FATAL_ERROR "resume is not bit-exact: uninterrupted ${full}, killed + resumed ${resumed}")
endif()
