# Prints what a test preset of CMakePresets.json sets, as shell lines for tools/sanitize to eval
# (ctest 3.25 ignores --test-dir with --preset, so the script runs ctest on its own build tree
# and takes the options from here: the presets stay the one place that holds them).
#   cmake -DPRESET=<name> -DSOURCE_DIR=<root> -P preset_env.cmake
#   -> export NAME='value'      for each entry of "environment" (${sourceDir} expanded)
#   -> ZERO_CTEST_LABELS='re'   the preset's filter.include.label, when it has one
#   -> ZERO_CTEST_EXCLUDE_LABELS='re'   its filter.exclude.label, when it has one
file(READ "${SOURCE_DIR}/CMakePresets.json" presets)
string(JSON count LENGTH "${presets}" testPresets)
math(EXPR last "${count} - 1")
foreach(i RANGE ${last})
  string(JSON name GET "${presets}" testPresets ${i} name)
  if(NOT name STREQUAL PRESET)
    continue()
  endif()
  string(JSON env ERROR_VARIABLE no_env GET "${presets}" testPresets ${i} environment)
  if(NOT no_env)
    string(JSON n LENGTH "${env}")
    math(EXPR n_last "${n} - 1")
    foreach(j RANGE ${n_last})
      string(JSON key MEMBER "${env}" ${j})
      string(JSON value GET "${env}" ${key})
      string(REPLACE "\${sourceDir}" "${SOURCE_DIR}" value "${value}")
      message("export ${key}='${value}'")
    endforeach()
  endif()
  string(JSON label ERROR_VARIABLE no_label GET "${presets}" testPresets ${i} filter include label)
  if(NOT no_label)
    message("ZERO_CTEST_LABELS='${label}'")
  endif()
  string(JSON exclude ERROR_VARIABLE no_exclude GET "${presets}" testPresets ${i} filter exclude
         label)
  if(NOT no_exclude)
    message("ZERO_CTEST_EXCLUDE_LABELS='${exclude}'")
  endif()
  return()
endforeach()
message(FATAL_ERROR "no test preset named ${PRESET} in ${SOURCE_DIR}/CMakePresets.json")
