# Benchmarks in smoke mode: they run end to end and their ratio claims hold (no timings asserted).
add_test(NAME bench_codec_smoke
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/bench/smoke_codec.sh $<TARGET_FILE:ckptctl>)
set_tests_properties(bench_codec_smoke PROPERTIES TIMEOUT 600)
