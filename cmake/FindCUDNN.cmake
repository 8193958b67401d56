# FindCUDNN.cmake - cuDNN (CMake's FindCUDAToolkit does not cover it).
#
# Result: CUDNN_FOUND, CUDNN_VERSION, CUDNN_INCLUDE_DIR, CUDNN_LIBRARY and the imported target
# CUDNN::cudnn. Hints, in this order: CUDNN_ROOT (CMake or environment variable), CUDNN_HOME, the
# CUDA toolkit's directories, /usr/local/cuda, /usr. The Python wheel nvidia-cudnn-cu13 (what
# PyTorch installs) works too: -DCUDNN_ROOT=<site-packages>/nvidia/cudnn. Its library is named
# libcudnn.so.9 only (no development symlink), which is searched for as well.
include(FindPackageHandleStandardArgs)

set(_cudnn_hints)
foreach(_v IN ITEMS CUDNN_ROOT CUDNN_HOME)
  if(DEFINED ${_v})
    list(APPEND _cudnn_hints "${${_v}}")
  endif()
  if(DEFINED ENV{${_v}})
    list(APPEND _cudnn_hints "$ENV{${_v}}")
  endif()
endforeach()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _cudnn_hints "${CUDAToolkit_LIBRARY_ROOT}")
endif()
if(CUDAToolkit_INCLUDE_DIRS)
  foreach(_d IN LISTS CUDAToolkit_INCLUDE_DIRS)
    get_filename_component(_p "${_d}" DIRECTORY)
    list(APPEND _cudnn_hints "${_p}")
  endforeach()
endif()
list(APPEND _cudnn_hints /usr/local/cuda /usr)

find_path(CUDNN_INCLUDE_DIR NAMES cudnn_version.h cudnn.h
  HINTS ${_cudnn_hints} PATH_SUFFIXES include include/x86_64-linux-gnu targets/x86_64-linux/include)
find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 libcudnn.so.8
  HINTS ${_cudnn_hints} PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu targets/x86_64-linux/lib)

set(CUDNN_VERSION "")
if(CUDNN_INCLUDE_DIR)
  set(_cudnn_version_file "${CUDNN_INCLUDE_DIR}/cudnn_version.h")
  if(NOT EXISTS "${_cudnn_version_file}")
    set(_cudnn_version_file "${CUDNN_INCLUDE_DIR}/cudnn.h")
  endif()
  file(STRINGS "${_cudnn_version_file}" _cudnn_lines REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
  foreach(_part IN ITEMS MAJOR MINOR PATCHLEVEL)
    string(REGEX MATCH "CUDNN_${_part} +([0-9]+)" _m "${_cudnn_lines}")
    set(_cudnn_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  if(NOT _cudnn_MAJOR STREQUAL "")
    set(CUDNN_VERSION "${_cudnn_MAJOR}.${_cudnn_MINOR}.${_cudnn_PATCHLEVEL}")
  endif()
endif()

find_package_handle_standard_args(CUDNN
  REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR
  VERSION_VAR CUDNN_VERSION)

if(CUDNN_FOUND AND NOT TARGET CUDNN::cudnn)
  add_library(CUDNN::cudnn UNKNOWN IMPORTED)
  set_target_properties(CUDNN::cudnn PROPERTIES
    IMPORTED_LOCATION "${CUDNN_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
