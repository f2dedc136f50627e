# The project's version has one home: the `version` key of pyproject.toml's [project] table. scikit-build-core
# passes it to CMake (SKBUILD_PROJECT_VERSION, SKBUILD_PROJECT_VERSION_FULL); a standalone `cmake -S .` (no Python,
# no scikit-build) reads the file itself with the function below.
#
#   ort_rmsnorm_read_version(<pyproject.toml> <out: version as written> <out: numeric X[.Y[.Z[.W]]] for project()>)
#
# As a script it prints the version it reads, so tests can compare it with a TOML parser's reading:
#   cmake -DPYPROJECT=pyproject.toml -P cmake/version.cmake

function(ort_rmsnorm_read_version pyproject out_version out_numeric)
  if(NOT EXISTS "${pyproject}")
    message(FATAL_ERROR "ort_rmsnorm: ${pyproject} not found: the project's version is read from its "
      "[project] table")
  endif()
  file(STRINGS "${pyproject}" _lines)
  set(_table "")
  set(_version "")
  foreach(_line IN LISTS _lines)
    if(_line MATCHES "^[ \t]*\\[[ \t]*([A-Za-z0-9_.\"-]+)[ \t]*\\][ \t]*(#.*)?$")
      set(_table "${CMAKE_MATCH_1}")
    elseif(_table STREQUAL "project" AND _line MATCHES "^[ \t]*version[ \t]*=[ \t]*[\"']([^\"']+)[\"']")
      set(_version "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  if(_version STREQUAL "")
    message(FATAL_ERROR "ort_rmsnorm: no `version = \"...\"` in the [project] table of ${pyproject}")
  endif()
  # project(VERSION) takes at most four numeric components: "1.2.0rc1" -> "1.2.0".
  string(REGEX MATCH "^[0-9]+(\\.[0-9]+)?(\\.[0-9]+)?(\\.[0-9]+)?" _numeric "${_version}")
  if(_numeric STREQUAL "")
    message(FATAL_ERROR "ort_rmsnorm: version \"${_version}\" in ${pyproject} does not start with a number")
  endif()
  set(${out_version} "${_version}" PARENT_SCOPE)
  set(${out_numeric} "${_numeric}" PARENT_SCOPE)
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  if(NOT PYPROJECT)
    get_filename_component(PYPROJECT "${CMAKE_CURRENT_LIST_DIR}/../pyproject.toml" ABSOLUTE)
  endif()
  ort_rmsnorm_read_version("${PYPROJECT}" _version _numeric)
  execute_process(COMMAND "${CMAKE_COMMAND}" -E echo "${_version}")
endif()
