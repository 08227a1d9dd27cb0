# Installs the built zero into a scratch prefix, then configures, builds and runs the consumer
# project against it. Arguments: BUILD_DIR (zero's build tree), SOURCE_DIR. The prefix and the
# consumer's build live in the test's own directory (tests/common/temp_dir.cmake), removed at the
# end.
include(${CMAKE_CURRENT_LIST_DIR}/../common/temp_dir.cmake)
zero_test_temp_dir(WORK_DIR core_find_package)
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix"
                RESULT_VARIABLE rc)
if(rc)
  zero_test_fail("cmake --install failed: ${rc}")
endif()
# Only the detail headers a public header includes are installed (the others are the build's).
file(GLOB_RECURSE installed_detail RELATIVE "${WORK_DIR}/prefix/include/zero"
     "${WORK_DIR}/prefix/include/zero/*/detail/*")
list(SORT installed_detail)
set(expected_detail "core/detail/hd.hpp;optim/detail/moment_quant.hpp;optim/detail/optim_math.hpp")
if(NOT installed_detail STREQUAL expected_detail)
  zero_test_fail("installed include/zero/*/detail/ holds '${installed_detail}'; expected \
'${expected_detail}' (a private header is installed, or a public header's detail header is not)")
endif()
# The consumer is built the way zero was: same compiler, same global flags (a sanitizer build's
# -fsanitize=... must reach the consumer's objects and link too, or linking the instrumented
# libzero.a fails), and the TBB zero was configured against (tools/sanitize tsan uses a
# TSan-built oneTBB).
load_cache("${BUILD_DIR}" READ_WITH_PREFIX zero_ CMAKE_CXX_COMPILER CMAKE_CXX_FLAGS
           CMAKE_EXE_LINKER_FLAGS TBB_DIR)
set(consumer_args "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" -DCMAKE_BUILD_TYPE=Release
                  "-DCMAKE_CXX_COMPILER=${zero_CMAKE_CXX_COMPILER}"
                  "-DCMAKE_CXX_FLAGS=${zero_CMAKE_CXX_FLAGS}"
                  "-DCMAKE_EXE_LINKER_FLAGS=${zero_CMAKE_EXE_LINKER_FLAGS}")
if(zero_TBB_DIR)
  list(APPEND consumer_args "-DTBB_DIR=${zero_TBB_DIR}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}/build" -G Ninja
                        ${consumer_args}
                RESULT_VARIABLE rc)
if(rc)
  zero_test_fail("configuring the consumer against the installed package failed: ${rc}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${WORK_DIR}/build" RESULT_VARIABLE rc)
if(rc)
  zero_test_fail("building the consumer failed: ${rc}")
endif()
execute_process(COMMAND "${WORK_DIR}/build/consumer" RESULT_VARIABLE rc)
if(rc)
  zero_test_fail("the consumer failed: ${rc}")
endif()
zero_test_done()
