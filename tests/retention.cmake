# Retention and management (issue 5): unit tests of the control channel, store_session and
# ckptctl's helpers (tests/unit/admin_*.cpp, in unit_tests), and mount tests that drive
# `ckptctl ls/stat/prune/rm/verify/export/gc` live and offline with real torch checkpoints.
if(NOT TARGET ckpt_admin)
  return()
endif()
target_link_libraries(unit_tests PRIVATE ckpt_admin ckptctl_util)
