# zero_add_test(<name> SOURCES <files...> LABELS <labels...> [MPI_RANKS <n...>] [TIMEOUT <s>])
# One GoogleTest executable per call, registered with ctest as one test (or one per MPI world
# size, run under mpirun) carrying the given labels, so `ctest -L <area>` runs an area alone.
#
# The test programs' own code (the test bodies, their references and GoogleTest's macros; the
# library they link keeps the build type's flags) is compiled with ZERO_TEST_CXX_FLAGS after the
# build type's: code generation is most of a test file's compile (offload_test.cpp at -O2 -g:
# 14.2 s of CPU, 2.5 s of it parsing), and the tests are over half of the tree's compile. Measured on
# offload_test.cpp, CPU seconds: -O2 -g 14.2, -O2 -g1 10.4, -O1 -g1 7.8; optimizer_test, whose
# float64 references run in the test's own code, ran 29.4 s at -O2 and 31.8 s at -O1. -Og halves
# a test file's compile again under ASan but made optimizer_test's run 36% longer there. Set it
# empty for the build type's flags (e.g. -DZERO_TEST_CXX_FLAGS= for a debugger session).
set(ZERO_TEST_CXX_FLAGS "-O1 -g1" CACHE STRING
    "Flags for the test programs' own code, after the build type's (empty: the build type's alone)")
separate_arguments(_zero_test_cxx_flags UNIX_COMMAND "${ZERO_TEST_CXX_FLAGS}")

# A test's TIMEOUT guards against a hang; the values written beside the tests are about three
# times what each test takes on a quiet machine. The suite must also hold on a loaded one (two
# busy processes beside it on 2 cores, or a build: gpt_model_test's 144 parity runs took over
# its 300 s there), so every test's TIMEOUT is multiplied by this integer, once, at the end of
# the directory that adds it (zero_add_test's tests and those added with add_test beside them).
set(ZERO_TEST_TIMEOUT_SCALE 3 CACHE STRING
    "Integer multiplier of every test's TIMEOUT (a hang guard sized on a quiet machine)")

function(zero_scale_directory_timeouts)
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(t IN LISTS tests)
    get_test_property(${t} TIMEOUT seconds)
    if(seconds)
      math(EXPR seconds "${seconds} * ${ZERO_TEST_TIMEOUT_SCALE}")
      set_tests_properties(${t} PROPERTIES TIMEOUT ${seconds})
    endif()
  endforeach()
endfunction()

# Schedules zero_scale_directory_timeouts at the end of the calling directory, once.
function(zero_scale_timeouts_at_directory_end)
  get_property(scheduled DIRECTORY PROPERTY ZERO_TIMEOUTS_SCALED)
  if(NOT scheduled)
    set_property(DIRECTORY PROPERTY ZERO_TIMEOUTS_SCALED TRUE)
    cmake_language(DEFER CALL zero_scale_directory_timeouts)
  endif()
endfunction()

function(zero_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LABELS;MPI_RANKS;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE zero::zero GTest::gtest GTest::gtest_main ${ARG_LIBS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/tests)
  target_compile_options(${name} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
  foreach(flag IN LISTS _zero_test_cxx_flags)
    target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${flag}>)
  endforeach()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  zero_scale_timeouts_at_directory_end()
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
