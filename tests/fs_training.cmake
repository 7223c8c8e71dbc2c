# Checkpoints through a real mount (issue 4): a real training loop in four save styles, and
# malformed files that look like checkpoints, lossy keyframes coding values as their head did.
# Registered once the daemon target exists.
if(TARGET ckptfs)
  foreach(name training_styles bad_checkpoints keyframe_values long_chains)
    add_test(NAME fs.${name}
             COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/fs/${name}.py
                     $<TARGET_FILE:ckptfs> $<TARGET_FILE:ckptctl>)
    set_tests_properties(fs.${name} PROPERTIES TIMEOUT 900 SKIP_RETURN_CODE 77)
  endforeach()
endif()
