# Format recognisers (issue 3): unit tests link the library; real-file tests drive a small helper
# and Debian's /usr/bin/python3 (torch, numpy); fuzzers build with clang (tests/fuzz/).
target_link_libraries(unit_tests PRIVATE ckpt_format)

add_executable(format_tool ${CMAKE_CURRENT_SOURCE_DIR}/tools/format_tool.cpp)
target_link_libraries(format_tool PRIVATE ckpt_format)

set(format_corpus ${CMAKE_BINARY_DIR}/formats/corpus)
set(format_script ${CMAKE_CURRENT_SOURCE_DIR}/formats/real_files.py)

# Seed files, regenerated on every run by the real torch and numpy.
add_test(NAME formats.corpus COMMAND ${CMAKE_COMMAND} -E env PYTHONNOUSERSITE=1
  /usr/bin/python3 ${format_script} corpus ${format_corpus})
set_tests_properties(formats.corpus PROPERTIES FIXTURES_SETUP format_corpus TIMEOUT 120)

add_test(NAME formats.roundtrip COMMAND /usr/bin/python3 ${format_script} roundtrip
  ${format_corpus} $<TARGET_FILE:format_tool> $<TARGET_FILE:ckptctl>)
set_tests_properties(formats.roundtrip PROPERTIES FIXTURES_REQUIRED format_corpus TIMEOUT 300)

add_test(NAME formats.hostile COMMAND ${CMAKE_COMMAND} -E chdir ${format_corpus} sh -c
  "$<TARGET_FILE:format_tool> hostile *.pt *.npy *.npz *.safetensors *.distcp")
set_tests_properties(formats.hostile PROPERTIES FIXTURES_REQUIRED format_corpus TIMEOUT 300)

add_test(NAME formats.zip64 COMMAND /usr/bin/python3 ${format_script} zip64
  ${CMAKE_BINARY_DIR}/formats/zip64 $<TARGET_FILE:format_tool>)
set_tests_properties(formats.zip64 PROPERTIES TIMEOUT 600 RUN_SERIAL FALSE)

# libFuzzer targets, one per recogniser, built with clang by a script (the project compiler may be
# gcc) and each run for a bounded time on seeds made from the real files.
set(fuzz_dir ${CMAKE_BINARY_DIR}/fuzz)
set(fuzz_script ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/build_and_run.sh)
set(CKPTFS_FUZZ_SECONDS 25 CACHE STRING "Seconds each format fuzzer runs under ctest")
add_test(NAME formats.fuzz.build COMMAND ${fuzz_script} build ${fuzz_dir})
set_tests_properties(formats.fuzz.build PROPERTIES FIXTURES_SETUP fuzz_build TIMEOUT 600)
foreach(target torch_zip pickle safetensors npy distcp)
  add_test(NAME formats.fuzz.${target} COMMAND ${fuzz_script} run ${fuzz_dir} ${target}
    ${CKPTFS_FUZZ_SECONDS} ${format_corpus}/seeds/${target})
  set_tests_properties(formats.fuzz.${target} PROPERTIES
    FIXTURES_REQUIRED "fuzz_build;format_corpus" TIMEOUT 300)
endforeach()

# ckptctl inspect exit codes: 0 for any readable file (opaque included), 1 unreadable, 2 usage.
add_test(NAME formats.inspect_exit_codes COMMAND sh -c
  "$<TARGET_FILE:ckptctl> inspect $<TARGET_FILE:ckptctl> >/dev/null && \
   $<TARGET_FILE:ckptctl> inspect --json $<TARGET_FILE:ckptctl> | grep -q '\"format\": \"opaque\"' && \
   { $<TARGET_FILE:ckptctl> inspect /nonexistent/file 2>/dev/null; test $? -eq 1; } && \
   { $<TARGET_FILE:ckptctl> inspect 2>/dev/null; test $? -eq 2; } && \
   { $<TARGET_FILE:ckptctl> inspect --bogus x 2>/dev/null; test $? -eq 2; }")
