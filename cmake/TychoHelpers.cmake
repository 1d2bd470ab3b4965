# ty_add_test(NAME name SOURCES a.c ... [LIBS l ...] [LABELS unit|integration|gpu|rdma|slow ...]
#             [TIMEOUT seconds] [ARGS ...] [ENV K=V ...])
# One test binary per module, registered with ctest. Exit code 77 means "skipped" (no GPU, no
# RDMA device, no test data). TYCHO_TEST_DATA and TYCHO_BUILD_DIR are set for every test, and
# TYCHO_SANITIZER_SLOW=1 in sanitizer builds (TY_TEST_SANITIZER_ENV, CMakeLists.txt).
function(ty_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS;ARGS;ENV" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 60)
  endif()
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} PkgConfig::CMOCKA)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS})
  set_tests_properties(${T_NAME} PROPERTIES
    LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT} SKIP_RETURN_CODE 77
    ENVIRONMENT "TYCHO_TEST_DATA=${TYCHO_TEST_DATA};TYCHO_BUILD_DIR=${CMAKE_BINARY_DIR};TYCHO_SOURCE_DIR=${CMAKE_SOURCE_DIR};TYCHO_PEERS_DIR=${TYCHO_PEERS_DIR};${TY_TEST_SANITIZER_ENV};${TY_TEST_CLUSTER_ENV};${T_ENV}")
endfunction()

# ty_add_script_test(NAME name COMMAND cmd ... [LABELS ...] [TIMEOUT s] [ENV K=V ...])
# A test that is a script (shell or node) driving the real binaries.
function(ty_add_script_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "COMMAND;LABELS;ENV" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  if(NOT T_LABELS)
    set(T_LABELS integration)
  endif()
  add_test(NAME ${T_NAME} COMMAND ${T_COMMAND})
  set_tests_properties(${T_NAME} PROPERTIES
    LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT} SKIP_RETURN_CODE 77
    ENVIRONMENT "TYCHO_TEST_DATA=${TYCHO_TEST_DATA};TYCHO_BUILD_DIR=${CMAKE_BINARY_DIR};TYCHO_SOURCE_DIR=${CMAKE_SOURCE_DIR};TYCHO_PEERS_DIR=${TYCHO_PEERS_DIR};${TY_TEST_SANITIZER_ENV};${TY_TEST_CLUSTER_ENV};${T_ENV}")
endfunction()

# ty_add_fuzz(NAME name SOURCES ... LIBS ...): a libFuzzer target, built only with
# -DTYCHO_FUZZ=ON and clang. Seeds live in tests/fuzz/corpus/<name>/.
function(ty_add_fuzz)
  cmake_parse_arguments(T "" "NAME" "SOURCES;LIBS" ${ARGN})
  if(NOT TYCHO_FUZZ)
    return()
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_compile_options(${T_NAME} PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(${T_NAME} PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS})
endfunction()
