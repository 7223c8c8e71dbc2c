# A real training loop through a real mount (issue 4): registered once the daemon target exists.
if(TARGET ckptfs)
  add_test(NAME fs.training_styles
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/fs/training_styles.py
                   $<TARGET_FILE:ckptfs> $<TARGET_FILE:ckptctl>)
  set_tests_properties(fs.training_styles PROPERTIES TIMEOUT 900)
endif()
