# Runs char-transformer-lora end to end and checks what it reports: exit status 0, the frozen base
# bitwise the imported weights after training, the imported weights bitwise the pretrained ones,
# the LoRA run's gradient, master and state bytes each below the all-trainable run's.
#   cmake -DCMD="prog|arg1|arg2" -DWORK=dir -P lora_example_check.cmake
# ("|" separates the arguments: ctest would split a ";" list.)
string(REPLACE "|" ";" cmd "${CMD}")
file(REMOVE_RECURSE "${WORK}")
execute_process(COMMAND ${cmd} --work-dir "${WORK}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err TIMEOUT 600)
message(STATUS "${out}")
if(NOT rc STREQUAL "0")
  message(FATAL_ERROR "${CMD}: exit status '${rc}', expected 0 (stderr: ${err})")
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
    message(FATAL_ERROR "${CMD}: the output does not match '${needle}'")
  endif()
endforeach()
