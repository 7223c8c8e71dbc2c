# Mount tests (issue 4): real clients through a real ckptfs mount, under Debian's /usr/bin/python3.
# Each test mounts on a fresh temporary store and always unmounts (tests/fs/ckptfs_testlib.py).
# They need /dev/fuse and root; RUN_SERIAL keeps the 2-core box from timing them out.
if(NOT TARGET ckptfs)
  return()
endif()
set(fs_tests ${CMAKE_CURRENT_SOURCE_DIR}/fs)
foreach(name patterns differential)
  add_test(NAME fs.${name} COMMAND /usr/bin/python3 ${fs_tests}/${name}.py $<TARGET_FILE:ckptfs>)
  set_tests_properties(fs.${name} PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE)
endforeach()
