# cmake/TrainkitWheelRoots.cmake - where NVIDIA's Python wheels put a library: the directories
# <site-packages>/nvidia/{SUB,cu13,cu12} of every site-packages directory python3 reports
# (Python3_EXECUTABLE or python3 on PATH; the user site too). Used by FindCUDNN.cmake and
# FindNCCL.cmake (installed beside them).
#
#   trainkit_wheel_roots(<out-var> <sub>)   e.g. trainkit_wheel_roots(_roots nccl)
include_guard(GLOBAL)

function(trainkit_wheel_roots out sub)
  # The site-packages list is computed once per configure.
  get_property(_have GLOBAL PROPERTY TRAINKIT_PY_SITE_DIRS SET)
  if(NOT _have)
    set(_py "${Python3_EXECUTABLE}")
    if(NOT _py)
      find_program(_trainkit_py_prog NAMES python3 python)
      mark_as_advanced(_trainkit_py_prog)
      set(_py "${_trainkit_py_prog}")
    endif()
    set(_dirs "")
    if(_py)
      execute_process(
        COMMAND "${_py}" -c "import site, sys; d = list(getattr(site, 'getsitepackages', lambda: [])()); u = getattr(site, 'getusersitepackages', lambda: '')(); d += [u] if u else []; d += [p for p in sys.path if p.endswith(('site-packages', 'dist-packages'))]; print(';'.join(dict.fromkeys(d)))"
        OUTPUT_VARIABLE _dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc TIMEOUT 20)
      if(NOT _rc EQUAL 0)
        set(_dirs "")
      endif()
    endif()
    set_property(GLOBAL PROPERTY TRAINKIT_PY_SITE_DIRS "${_dirs}")
  endif()
  get_property(_dirs GLOBAL PROPERTY TRAINKIT_PY_SITE_DIRS)
  set(_roots)
  foreach(_d IN LISTS _dirs)
    foreach(_s IN ITEMS ${sub} cu13 cu12)
      if(IS_DIRECTORY "${_d}/nvidia/${_s}")
        list(APPEND _roots "${_d}/nvidia/${_s}")
      endif()
    endforeach()
  endforeach()
  set(${out} "${_roots}" PARENT_SCOPE)
endfunction()
