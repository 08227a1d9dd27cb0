# Runs char-transformer-lora end to end and checks what it reports: exit status 0, the frozen base
# bitwise the imported weights after training, the imported weights bitwise the pretrained ones,
# the LoRA run's gradient, master and state bytes each below the all-trainable run's.
#   cmake -DCMD="prog|arg1|arg2" -DNAME=test-name -P lora_example_check.cmake
# ("|" separates the arguments: ctest would split a ";" list.) The example's files go to a
# directory of the test's own (tests/common/temp_dir.cmake), removed at the end.
include(${CMAKE_CURRENT_LIST_DIR}/../common/temp_dir.cmake)
string(REPLACE "|" ";" cmd "${CMD}")
zero_test_temp_dir(WORK "${NAME}")
execute_process(COMMAND ${cmd} --work-dir "${WORK}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err TIMEOUT 600)
message(STATUS "${out}")
if(NOT rc STREQUAL "0")
  zero_test_fail("${CMD}: exit status '${rc}', expected 0 (stderr: ${err})")
endif()
foreach(needle
    "exported .*pretrained.safetensors"
    "imported [0-9]+ tensors from .*; [1-9][0-9]* base parameters frozen, [1-9][0-9]* trained"
    "held-out loss [^\n]*: before fine-tuning [0-9.]+, after [0-9.]+"
    "frozen base after training: 0 of [1-9][0-9]* parameters changed: bitwise the imported weights"
    "imported weights: 0 of [1-9][0-9]* differ from pretraining's: bitwise"
    "\nall-trainable +[0-9]+ +[1-9][0-9]* +[0-9]+ +[1-9][0-9]*\n"
    "\nLoRA \\(base frozen\\) +[0-9]+ +[1-9][0-9]* +[0-9]+ +[1-9][0-9]*\n"
    "gradients \\+ master \\+ state: LoRA [0-9]+, all-trainable [0-9]+ [^\n]*: each below the all-trainable run's")
  if(NOT out MATCHES "${needle}")
    zero_test_fail("${CMD}: the output does not match '${needle}'")
  endif()
endforeach()
zero_test_done()
