# Mount tests (issue 4): real clients through a real ckptfs mount, under Debian's /usr/bin/python3.
# Each test mounts on a fresh temporary store and always unmounts (tests/fs/ckptfs_testlib.py).
# They need /dev/fuse and root; without them they exit 77, which ctest reports as skipped.
# Unit tests of the namespace library (tests/unit/namespace_*.cpp, write_buffer.cpp).
if(TARGET ckpt_namespace)
  target_link_libraries(unit_tests PRIVATE ckpt_namespace)
endif()
if(NOT TARGET ckptfs)
  return()
endif()
set(fs_tests ${CMAKE_CURRENT_SOURCE_DIR}/fs)
foreach(name patterns differential faults concurrency mmap_reads ordinary distcp sharded rotation
             distcp_rotation cold_reads read_after_close)
  add_test(NAME fs.${name} COMMAND /usr/bin/python3 ${fs_tests}/${name}.py $<TARGET_FILE:ckptfs>)
  # Exit 77 (no /dev/fuse, not root) is a skip, not a pass.
  set_tests_properties(fs.${name} PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
endforeach()
# Standard exercisers (issue 14): stress-ng's filesystem stressors and fio with verification on a
# small budget, the daemon's RSS watched (about 70 s, CPU-heavy: alone).
add_test(NAME fs.stress COMMAND /usr/bin/python3 ${fs_tests}/stress.py $<TARGET_FILE:ckptfs>)
set_tests_properties(fs.stress PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE SKIP_RETURN_CODE 77)
# mount.sh builds through scripts/bootstrap.sh into the source tree's build/: run it alone.
add_test(NAME fs.mount_sh COMMAND /usr/bin/python3 ${fs_tests}/mount_sh.py ${PROJECT_SOURCE_DIR})
set_tests_properties(fs.mount_sh PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE SKIP_RETURN_CODE 77)
# Scale (issue 13): a 2 GiB checkpoint under a small memory budget, -o lossless memory over 10
# versions, four concurrent writers, faults around streaming writes and head images, FUSE
# passthrough, kill -9 during rotation's background rewrites (issue 16). Each takes 0.5-2
# minutes on a quiet 2-core machine and GiBs of memory and disk:
# they never run at the same time as each other (RESOURCE_LOCK), and the two largest run alone
# (RUN_SERIAL), so that their time limits hold on a loaded CI machine. The watchdog
# (CKPTFS_TEST_DEADLINE) fires before ctest's TIMEOUT, so a hang unmounts and reports.
foreach(spec "scale_memory 600 serial" "scale_writers 400 serial" "scale_lossless 400 shared"
             "scale_faults 400 shared" "scale_passthrough 400 shared" "streaming 400 shared"
             "rotation_crash 300 shared")
  separate_arguments(spec)
  list(GET spec 0 name)
  list(GET spec 1 timeout)
  list(GET spec 2 mode)
  math(EXPR deadline "${timeout} - 60")
  add_test(NAME fs.${name} COMMAND /usr/bin/python3 ${fs_tests}/${name}.py
                                   $<TARGET_FILE:ckptfs> $<TARGET_FILE:ckptctl>)
  set_tests_properties(fs.${name} PROPERTIES TIMEOUT ${timeout} SKIP_RETURN_CODE 77
                       RESOURCE_LOCK ckptfs_scale ENVIRONMENT CKPTFS_TEST_DEADLINE=${deadline})
  if(mode STREQUAL "serial")
    set_tests_properties(fs.${name} PROPERTIES RUN_SERIAL TRUE)
  endif()
endforeach()
# Four ranks whose reconstructions each fit in half the cache, not all together (heads=off):
# they share the cache, and the admin socket counts what was kept and what was not (~15 s).
add_test(NAME fs.scale_writers_shared_cache
         COMMAND /usr/bin/python3 ${fs_tests}/scale_writers.py $<TARGET_FILE:ckptfs>
                 $<TARGET_FILE:ckptctl> --writers 4 --mib 160 --steps 3 --heads-off
                 --cache-mib 512)
set_tests_properties(fs.scale_writers_shared_cache PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77
                     RESOURCE_LOCK ckptfs_scale ENVIRONMENT CKPTFS_TEST_DEADLINE=240)
