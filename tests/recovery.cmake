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
