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
      zero_test_starts_mpi(${name}_np${n})
    endforeach()
  else()
    add_test(NAME ${name} COMMAND ${name})
    set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
  endif()
endfunction()

# zero_test_starts_mpi(<test>...): the tests start MPI processes (mpirun), so under ASan those
# record allocation stacks with the slow unwinder: OpenMPI is built without frame pointers, and
# LeakSanitizer matches the suppressions of its by-design leaks (tools/sanitizers/lsan.supp) by
# module, a frame the fast unwinder does not reach. Every other test keeps ASan's fast default:
# the slow unwinder on every allocation tripled an engine test's CPU time under ASan. Outside an
# ASan build the variable is read by nothing.
function(zero_test_starts_mpi)
  set_property(TEST ${ARGN} APPEND PROPERTY ENVIRONMENT_MODIFICATION
               "ASAN_OPTIONS=string_append::fast_unwind_on_malloc=0")
endfunction()
