# Install test: installs the built lockstep into a fresh prefix, then configures, builds and runs
# tests/install/consumer (a project outside the tree using find_package(lockstep)) against it.
# Run by ctest as `cmake -D... -P run_install_test.cmake`; see tests/CMakeLists.txt.
#
# Inputs: LOCKSTEP_BINARY_DIR (lockstep's build tree), CONSUMER_SOURCE_DIR, WORK_DIR (wiped and
# reused), GENERATOR, CXX_COMPILER, CXX_LAUNCHER (may be empty), BUILD_TYPE, SANITIZE (ON/OFF).
cmake_minimum_required(VERSION 3.25)

foreach(var LOCKSTEP_BINARY_DIR CONSUMER_SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_install_test.cmake: ${var} is not set")
  endif()
endforeach()
if("${BUILD_TYPE}" STREQUAL "")
  set(BUILD_TYPE Release)
endif()

set(prefix ${WORK_DIR}/prefix)
set(consumer_build ${WORK_DIR}/consumer-build)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run_step what)
  message(STATUS "install test: ${what}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install test: ${what} failed (${rc})")
  endif()
endfunction()

run_step("cmake --install into ${prefix}"
  ${CMAKE_COMMAND} --install ${LOCKSTEP_BINARY_DIR} --prefix ${prefix} --config ${BUILD_TYPE})

set(configure_args
  -S ${CONSUMER_SOURCE_DIR} -B ${consumer_build} -G ${GENERATOR}
  -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
  -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
  -DCMAKE_PREFIX_PATH=${prefix}
  # Only the fresh prefix may provide lockstep.
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
if(NOT "${CXX_LAUNCHER}" STREQUAL "")
  list(APPEND configure_args -DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_LAUNCHER})
endif()
if(SANITIZE)
  # A sanitized static lockstep needs the sanitizer runtimes at link time.
  list(APPEND configure_args "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined")
endif()
run_step("configure the consumer" ${CMAKE_COMMAND} ${configure_args})

# The consumer must have found the installed package, not lockstep's build tree.
file(STRINGS ${consumer_build}/CMakeCache.txt found_dir REGEX "^lockstep_DIR:")
string(REGEX REPLACE "^lockstep_DIR:[A-Z]+=" "" found_dir "${found_dir}")
file(REAL_PATH "${prefix}" real_prefix)
file(REAL_PATH "${found_dir}" real_found)
string(FIND "${real_found}" "${real_prefix}/" at)
if(NOT at EQUAL 0)
  message(FATAL_ERROR "install test: lockstep was found in '${found_dir}', not under ${prefix}")
endif()

run_step("build the consumer" ${CMAKE_COMMAND} --build ${consumer_build} --config ${BUILD_TYPE})

find_program(consumer_exe consumer PATHS ${consumer_build} ${consumer_build}/${BUILD_TYPE}
  NO_DEFAULT_PATH REQUIRED)
run_step("run the consumer" ${consumer_exe})
