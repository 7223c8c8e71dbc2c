# Recovery-quality benchmark (issue 6) in its quick mode: torch training through a real mount,
# restores with torch.load; it fails when lossless restores are not bit-exact, when the ratio
# does not come from real store bytes, or when the daemon's defaults lose accuracy or compress
# less than 5x (tests/bench/recovery.py). Exit 77 (no /dev/fuse, not root) is a skip.
if(TARGET ckptfs)
  add_test(NAME bench.recovery_quick
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/bench/recovery.py
                   $<TARGET_FILE:ckptfs> --quick)
  set_tests_properties(bench.recovery_quick PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
endif()

# The language-model benchmark (issue 16) in its quick mode: a small transformer trained on
# perl-doc's text through a mount with six restores; it fails when lossless restores are not
# bit-exact, when store bytes disagree with the versions' or the defaults compress less than 4x
# (tests/bench/lm_run.py). Exit 77 (no FUSE, no perl-doc) is a skip.
if(TARGET ckptfs)
  add_test(NAME bench.lm_run_quick
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/bench/lm_run.py
                   $<TARGET_FILE:ckptfs> --quick --jobs 1)
  set_tests_properties(bench.lm_run_quick PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
endif()
