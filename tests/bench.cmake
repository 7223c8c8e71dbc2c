# Benchmarks in smoke mode: they run end to end and their ratio claims hold (no timings asserted).
add_test(NAME bench_codec_smoke
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/bench/smoke_codec.sh $<TARGET_FILE:ckptctl>)
set_tests_properties(bench_codec_smoke PROPERTIES TIMEOUT 600)

# The scale benchmark end to end at 0.25 GiB (about 30 s): saves, remounted loads of the newest,
# the keyframe and the version before the head, two concurrent writers; every load is checked
# against what was saved (a failed check exits 1). Shares the scale tests' lock (memory, disk).
add_test(NAME bench.fs_scale_quick
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/bench/fs_scale.py
                 $<TARGET_FILE:ckptfs> --ckptctl $<TARGET_FILE:ckptctl> --quick)
set_tests_properties(bench.fs_scale_quick PROPERTIES TIMEOUT 600 RESOURCE_LOCK ckptfs_scale)

# Cold loads of older versions at 0.1 GiB, once (about 20 s): runs end to end, the loads return.
add_test(NAME bench.fs_cold_versions_smoke
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/bench/fs_cold_versions.py
                 $<TARGET_FILE:ckptfs> --gib 0.1 --versions 3 --loads 1,2 --repeats 1)
set_tests_properties(bench.fs_cold_versions_smoke PROPERTIES TIMEOUT 300 RESOURCE_LOCK ckptfs_scale
                     SKIP_RETURN_CODE 77)

# The crash soak, short (4 kills of 96 MiB training states, about a minute): kill -9 of the
# daemon at random moments while a torch.save writer, a DCP writer (both rotating), an ordinary
# file's in-place rewriter and a last.pt saved over at every step work; after each kill every
# acknowledged file reads back as acknowledged, verify --deep is clean, gc finds nothing (the
# daemon's open removed what the kill left unrecorded). tests/bench/crash_soak.py runs longer.
add_test(NAME bench.crash_soak_short
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/bench/crash_soak.py
                 $<TARGET_FILE:ckptfs> --ckptctl $<TARGET_FILE:ckptctl> --kills 4 --size-mib 96)
set_tests_properties(bench.crash_soak_short PROPERTIES TIMEOUT 400 RESOURCE_LOCK ckptfs_scale
                     SKIP_RETURN_CODE 77 ENVIRONMENT CKPTFS_TEST_DEADLINE=340)
