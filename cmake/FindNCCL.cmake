# FindNCCL.cmake - NCCL (CMake's FindCUDAToolkit does not cover it).
#
# Result: NCCL_FOUND, NCCL_VERSION, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_LIBRARY_DIR and the
# imported targets NCCL::nccl (library + headers) and NCCL::headers (nccl.h alone). Looked for, in
# this order: NCCL_ROOT (CMake or environment variable), NCCL_HOME, the CUDA toolkit's directories,
# /usr/local/cuda, /usr, then the Python wheels (what PyTorch installs): <site-packages>/nvidia/nccl
# (nvidia-nccl-cu12/-cu13) and the CUDA-13 layout <site-packages>/nvidia/cu13, {include,lib} each,
# in every site-packages directory python3 reports. A wheel's library is named libnccl.so.2 only
# (no unversioned development symlink); that soname is searched for as well.
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

# The Python wheels' directories (nvidia/nccl, nvidia/cu13, nvidia/cu12 under site-packages).
include("${CMAKE_CURRENT_LIST_DIR}/TrainkitWheelRoots.cmake")
trainkit_wheel_roots(_nccl_wheel_roots nccl)

find_path(NCCL_INCLUDE_DIR NAMES nccl.h
  HINTS ${_nccl_hints} PATHS ${_nccl_wheel_roots}
  PATH_SUFFIXES include include/x86_64-linux-gnu targets/x86_64-linux/include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 libnccl.so.3
  HINTS ${_nccl_hints} PATHS ${_nccl_wheel_roots}
  PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu targets/x86_64-linux/lib)
# Any other versioned soname (libnccl.so.<N>) next to the header's wheel or root.
if(NOT NCCL_LIBRARY AND NCCL_INCLUDE_DIR)
  get_filename_component(_nccl_root "${NCCL_INCLUDE_DIR}" DIRECTORY)
  file(GLOB _nccl_sonames "${_nccl_root}/lib/libnccl.so.[0-9]*" "${_nccl_root}/lib64/libnccl.so.[0-9]*")
  if(_nccl_sonames)
    list(SORT _nccl_sonames)
    list(GET _nccl_sonames 0 _nccl_first)
    set(NCCL_LIBRARY "${_nccl_first}" CACHE FILEPATH "NCCL library" FORCE)
  endif()
endif()

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

if(NCCL_FOUND)
  get_filename_component(NCCL_LIBRARY_DIR "${NCCL_LIBRARY}" DIRECTORY)
  if(NOT TARGET NCCL::headers)
    add_library(NCCL::headers INTERFACE IMPORTED)
    set_target_properties(NCCL::headers PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  endif()
  if(NOT TARGET NCCL::nccl)
    add_library(NCCL::nccl UNKNOWN IMPORTED)
    set_target_properties(NCCL::nccl PROPERTIES
      IMPORTED_LOCATION "${NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  endif()
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
