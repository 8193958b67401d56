# FindNCCL.cmake - NCCL (CMake's FindCUDAToolkit does not cover it).
#
# Result: NCCL_FOUND, NCCL_VERSION, NCCL_INCLUDE_DIR, NCCL_LIBRARY and the imported target
# NCCL::nccl. Hints, in this order: NCCL_ROOT (CMake or environment variable), NCCL_HOME, the CUDA
# toolkit's directories, /usr/local/cuda, /usr. The Python wheel nvidia-nccl-cu13 (what PyTorch
# installs) works too: -DNCCL_ROOT=<site-packages>/nvidia/nccl; its library is named
# libnccl.so.2 only, which is searched for as well.
include(FindPackageHandleStandardArgs)

set(_nccl_hints)
foreach(_v IN ITEMS NCCL_ROOT NCCL_HOME)
  if(DEFINED ${_v})
    list(APPEND _nccl_hints "${${_v}}")
  endif()
  if(DEFINED ENV{${_v}})
    list(APPEND _nccl_hints "$ENV{${_v}}")
  endif()
endforeach()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_hints "${CUDAToolkit_LIBRARY_ROOT}")
endif()
if(CUDAToolkit_INCLUDE_DIRS)
  foreach(_d IN LISTS CUDAToolkit_INCLUDE_DIRS)
    get_filename_component(_p "${_d}" DIRECTORY)
    list(APPEND _nccl_hints "${_p}")
  endforeach()
endif()
list(APPEND _nccl_hints /usr/local/cuda /usr)

find_path(NCCL_INCLUDE_DIR NAMES nccl.h
  HINTS ${_nccl_hints} PATH_SUFFIXES include include/x86_64-linux-gnu targets/x86_64-linux/include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
  HINTS ${_nccl_hints} PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu targets/x86_64-linux/lib)

set(NCCL_VERSION "")
if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_part IN ITEMS MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_part} +([0-9]+)" _m "${_nccl_lines}")
    set(_nccl_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  if(NOT _nccl_MAJOR STREQUAL "")
    set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
  endif()
endif()

find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
