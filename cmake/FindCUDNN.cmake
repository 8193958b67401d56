# FindCUDNN.cmake - cuDNN (CMake's FindCUDAToolkit does not cover it).
#
# Result: CUDNN_FOUND, CUDNN_VERSION, CUDNN_INCLUDE_DIR, CUDNN_LIBRARY, CUDNN_LIBRARY_DIR and the
# imported target CUDNN::cudnn. Looked for, in this order: CUDNN_ROOT (CMake or environment
# variable), CUDNN_HOME, the CUDA toolkit's directories, /usr/local/cuda, /usr, then the Python wheels
# (what PyTorch installs): <site-packages>/nvidia/cudnn (nvidia-cudnn-cu12/-cu13) and the CUDA-13
# layout <site-packages>/nvidia/cu13, {include,lib} each, in every site-packages directory python3
# reports. A wheel's library is named libcudnn.so.9 only (no development symlink); the versioned
# sonames are searched for as well.
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

# The Python wheels' directories (nvidia/cudnn, nvidia/cu13, nvidia/cu12 under site-packages).
include("${CMAKE_CURRENT_LIST_DIR}/TrainkitWheelRoots.cmake")
trainkit_wheel_roots(_cudnn_wheel_roots cudnn)

find_path(CUDNN_INCLUDE_DIR NAMES cudnn_version.h cudnn.h
  HINTS ${_cudnn_hints} PATHS ${_cudnn_wheel_roots}
  PATH_SUFFIXES include include/x86_64-linux-gnu targets/x86_64-linux/include)
find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 libcudnn.so.10 libcudnn.so.8
  HINTS ${_cudnn_hints} PATHS ${_cudnn_wheel_roots}
  PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu targets/x86_64-linux/lib)
# Any other versioned soname (libcudnn.so.<N>) next to the header's wheel or root.
if(NOT CUDNN_LIBRARY AND CUDNN_INCLUDE_DIR)
  get_filename_component(_cudnn_root "${CUDNN_INCLUDE_DIR}" DIRECTORY)
  file(GLOB _cudnn_sonames "${_cudnn_root}/lib/libcudnn.so.[0-9]*" "${_cudnn_root}/lib64/libcudnn.so.[0-9]*")
  if(_cudnn_sonames)
    list(SORT _cudnn_sonames)
    list(GET _cudnn_sonames 0 _cudnn_first)
    set(CUDNN_LIBRARY "${_cudnn_first}" CACHE FILEPATH "cuDNN library" FORCE)
  endif()
endif()

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

if(CUDNN_FOUND)
  get_filename_component(CUDNN_LIBRARY_DIR "${CUDNN_LIBRARY}" DIRECTORY)
endif()
if(CUDNN_FOUND AND NOT TARGET CUDNN::cudnn)
  add_library(CUDNN::cudnn UNKNOWN IMPORTED)
  set_target_properties(CUDNN::cudnn PROPERTIES
    IMPORTED_LOCATION "${CUDNN_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
