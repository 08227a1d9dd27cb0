# Runs one program with arguments that make it fail and checks what a user sees: exit status 2
# (not a signal, not 0), exactly one line on stderr, and that line matching NEEDLE (a regex).
#   cmake -DCMD="prog|arg1|arg2" -DNEEDLE="regex" -P main_error_check.cmake
# ("|" separates the arguments: ctest would split a ";" list.)
string(REPLACE "|" ";" cmd "${CMD}")
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT 120)
string(REGEX REPLACE "\n$" "" line "${err}")
if(NOT rc STREQUAL "2")
  message(FATAL_ERROR "${CMD}: exit status '${rc}', expected 2 (stderr: ${err})")
endif()
if(line STREQUAL "" OR line MATCHES "\n")
  message(FATAL_ERROR "${CMD}: stderr is not one line:\n${err}")
endif()
if(NOT line MATCHES "${NEEDLE}")
  message(FATAL_ERROR "${CMD}: stderr does not match '${NEEDLE}':\n${err}")
endif()
message(STATUS "${CMD}: exit 2, ${line}")
