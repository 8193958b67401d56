# FindCUDNNFrontend.cmake - the cuDNN frontend: NVIDIA's header-only C++ graph API over cuDNN
# (cudnn_frontend.h), which PyPI's nvidia-cudnn-frontend installs as <site-packages>/include.
#
# Result: CUDNNFrontend_FOUND, CUDNN_FRONTEND_INCLUDE_DIR and the imported target
# CUDNNFrontend::headers (the include directory, as a system one: its headers are not -Werror
# clean). Looked for, in this order: CUDNN_FRONTEND_ROOT (CMake or environment variable), then the
# include directory beside every site-packages directory python3 reports (TrainkitWheelRoots.cmake).
include(FindPackageHandleStandardArgs)
include("${CMAKE_CURRENT_LIST_DIR}/TrainkitWheelRoots.cmake")

set(_cudnn_fe_hints)
foreach(_v IN ITEMS CUDNN_FRONTEND_ROOT)
  if(DEFINED ${_v})
    list(APPEND _cudnn_fe_hints "${${_v}}")
  endif()
  if(DEFINED ENV{${_v}})
    list(APPEND _cudnn_fe_hints "$ENV{${_v}}")
  endif()
endforeach()
trainkit_wheel_roots(_cudnn_fe_unused cudnn)  # fills TRAINKIT_PY_SITE_DIRS
get_property(_cudnn_fe_sites GLOBAL PROPERTY TRAINKIT_PY_SITE_DIRS)

find_path(CUDNN_FRONTEND_INCLUDE_DIR NAMES cudnn_frontend.h
  HINTS ${_cudnn_fe_hints} PATHS ${_cudnn_fe_sites}
  PATH_SUFFIXES include)
mark_as_advanced(CUDNN_FRONTEND_INCLUDE_DIR)

find_package_handle_standard_args(CUDNNFrontend REQUIRED_VARS CUDNN_FRONTEND_INCLUDE_DIR)

if(CUDNNFrontend_FOUND AND NOT TARGET CUDNNFrontend::headers)
  add_library(CUDNNFrontend::headers INTERFACE IMPORTED)
  set_target_properties(CUDNNFrontend::headers PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_FRONTEND_INCLUDE_DIR}"
                                                          INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${CUDNN_FRONTEND_INCLUDE_DIR}")
endif()
