# zero_add_test(<name> SOURCES <files...> LABELS <labels...> [MPI_RANKS <n...>] [TIMEOUT <s>])
# One GoogleTest executable per call, registered with ctest as one test (or one per MPI world
# size, run under mpirun) carrying the given labels, so `ctest -L <area>` runs an area alone.
function(zero_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LABELS;MPI_RANKS;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE zero::zero GTest::gtest GTest::gtest_main ${ARG_LIBS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/tests)
  target_compile_options(${name} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  if(ARG_MPI_RANKS)
    foreach(n ${ARG_MPI_RANKS})
      add_test(NAME ${name}_np${n}
        COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe ${MPIEXEC_NUMPROC_FLAG} ${n}
                $<TARGET_FILE:${name}>)
      set_tests_properties(${name}_np${n} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
        PROCESSORS ${n})
    endforeach()
  else()
    add_test(NAME ${name} COMMAND ${name})
    set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
  endif()
endfunction()
