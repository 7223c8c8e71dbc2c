# Retention and management (issue 5): unit tests of the control channel, store_session and
# ckptctl's helpers (tests/unit/admin_*.cpp, in unit_tests), and mount tests that drive
# `ckptctl ls/stat/prune/rm/verify/export/gc` live and offline with real torch checkpoints, and
# `ckptctl status` on a live mount.
if(NOT TARGET ckpt_admin)
  return()
endif()
target_link_libraries(unit_tests PRIVATE ckpt_admin ckptctl_util)

# Mount tests: tests/fs/retention.py, one ctest entry per scenario (see its docstring). They need
# /dev/fuse and root (exit 77 = skipped otherwise) and Debian's torch.
if(NOT TARGET ckptfs)
  return()
endif()
foreach(scenario prune_policies rm_export verify_damage concurrent crash cli status)
  add_test(NAME fs.retention.${scenario}
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/fs/retention.py ${scenario}
                   $<TARGET_FILE:ckptfs> $<TARGET_FILE:ckptctl>)
  set_tests_properties(fs.retention.${scenario} PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
endforeach()
