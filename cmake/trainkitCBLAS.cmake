# trainkitCBLAS.cmake - defines the imported target trainkit::cblas: BLAS::BLAS plus the include
# directory of the cblas.h that belongs to that BLAS.
#
# Used by trainkit's own CMakeLists.txt and, installed next to trainkitConfig.cmake, by consumers.
# Expects find_package(BLAS) (BLA_VENDOR OpenBLAS) to have run. Sets TRAINKIT_CBLAS_FOUND.
#
# Why not just <prefix>/include/cblas.h: on Debian /usr/include/<arch>/cblas.h is an
# update-alternatives link that may point at a different BLAS than the libopenblas.so we link, and
# OpenBLAS's own header lives in /usr/include/<arch>/openblas-{pthread,openmp,serial}/. We look
# first in the directory that matches the library actually found.

if(TARGET trainkit::cblas)
  set(TRAINKIT_CBLAS_FOUND TRUE)
  return()
endif()

set(TRAINKIT_CBLAS_FOUND FALSE)
if(NOT TARGET BLAS::BLAS)
  return()
endif()

set(_trainkit_cblas_hints "")
# <prefix>/lib/<arch>/openblas-openmp/libopenblas.so -> <prefix>/include/<arch>/openblas-openmp
foreach(_trainkit_lib IN LISTS BLAS_LIBRARIES)
  if(IS_ABSOLUTE "${_trainkit_lib}" AND EXISTS "${_trainkit_lib}")
    file(REAL_PATH "${_trainkit_lib}" _trainkit_real)
    get_filename_component(_trainkit_libdir "${_trainkit_real}" DIRECTORY)
    get_filename_component(_trainkit_variant "${_trainkit_libdir}" NAME)
    get_filename_component(_trainkit_root "${_trainkit_libdir}" DIRECTORY)
    get_filename_component(_trainkit_arch "${_trainkit_root}" NAME)
    get_filename_component(_trainkit_root "${_trainkit_root}" DIRECTORY)  # <prefix>/lib
    get_filename_component(_trainkit_root "${_trainkit_root}" DIRECTORY)  # <prefix>
    list(APPEND _trainkit_cblas_hints
      "${_trainkit_root}/include/${_trainkit_arch}/${_trainkit_variant}"
      "${_trainkit_root}/include/${_trainkit_variant}")
  endif()
endforeach()

# OpenBLAS installs a config file that names its include directory (Debian does too).
find_package(OpenBLAS CONFIG QUIET)
if(OpenBLAS_FOUND AND OpenBLAS_INCLUDE_DIRS)
  list(APPEND _trainkit_cblas_hints ${OpenBLAS_INCLUDE_DIRS})
endif()
find_path(TRAINKIT_CBLAS_INCLUDE_DIR cblas.h
  HINTS ${_trainkit_cblas_hints}
  PATH_SUFFIXES openblas-openmp openblas-pthread openblas-serial openblas
  DOC "Directory that holds OpenBLAS's cblas.h")
mark_as_advanced(TRAINKIT_CBLAS_INCLUDE_DIR)

if(TRAINKIT_CBLAS_INCLUDE_DIR)
  add_library(trainkit::cblas INTERFACE IMPORTED)
  set_target_properties(trainkit::cblas PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${TRAINKIT_CBLAS_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES BLAS::BLAS)
  set(TRAINKIT_CBLAS_FOUND TRUE)
endif()

unset(_trainkit_cblas_hints)
unset(_trainkit_lib)
unset(_trainkit_real)
unset(_trainkit_libdir)
unset(_trainkit_variant)
unset(_trainkit_root)
unset(_trainkit_arch)
