# tests/common/temp_dir.cmake — the per-test directory of the tests written as CMake scripts
# (cmake -P), as tests/common/temp_dir.hpp is for the C++ tests: made with mktemp -d under $TMPDIR
# (/tmp when unset) named after the test, and removed on every way out of the script, failure
# included, unless ZERO_TEST_KEEP_TMP is set (to anything but "" or "0").
#   include(.../tests/common/temp_dir.cmake)
#   zero_test_temp_dir(<var> <name>)   # <var> = the new directory
#   zero_test_fail(<message>)          # removes the directory, then FATAL_ERROR
#   zero_test_done()                   # removes the directory (the script's last line)

function(zero_test_temp_dir var name)
  set(base "$ENV{TMPDIR}")
  if(base STREQUAL "")
    set(base "/tmp")
  endif()
  execute_process(COMMAND mktemp -d "${base}/zero-${name}-XXXXXX" RESULT_VARIABLE rc
                  OUTPUT_VARIABLE dir ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(rc)
    message(FATAL_ERROR "mktemp -d under ${base} failed: ${err}")
  endif()
  set_property(GLOBAL PROPERTY ZERO_TEST_TEMP_DIR "${dir}")
  set(${var} "${dir}" PARENT_SCOPE)
endfunction()

function(zero_test_done)
  get_property(dir GLOBAL PROPERTY ZERO_TEST_TEMP_DIR)
  if(dir STREQUAL "")
    return()
  endif()
  if(NOT "$ENV{ZERO_TEST_KEEP_TMP}" STREQUAL "" AND NOT "$ENV{ZERO_TEST_KEEP_TMP}" STREQUAL "0")
    message(STATUS "kept ${dir} (ZERO_TEST_KEEP_TMP)")
  else()
    file(REMOVE_RECURSE "${dir}")
  endif()
  set_property(GLOBAL PROPERTY ZERO_TEST_TEMP_DIR "")
endfunction()

function(zero_test_fail message)
  zero_test_done()
  message(FATAL_ERROR "${message}")
endfunction()
