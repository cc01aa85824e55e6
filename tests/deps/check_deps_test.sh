#!/usr/bin/env bash
# Tests scripts/check-deps on a configured, built tree (the ctest entry passes its build
# directory): it passes with install-deps' list as it is, and fails, naming the package and a file
# it provides, when one package the build needs is taken out of the list: oneDNN's headers,
# the OpenCL library that oneDNN's CMake config finds (a Recommends only: the bug that once broke
# the README's commands on a fresh machine), the dataset the demo and tests read, and ccache,
# which CMake found.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$1"
status=0

out=$("$root/scripts/check-deps" "$build" 2>&1)
if [[ $? -ne 0 || "$out" != *"dependencies ok"* ]]; then
  printf 'FAIL: check-deps should pass on this build:\n%s\n' "$out"
  status=1
fi

expect_failure() {  # package, a file the message must name
  local pkg="$1" file="$2" out rc
  out=$("$root/scripts/check-deps" --without "$pkg" "$build" 2>&1)
  rc=$?
  if ((rc == 0)); then
    printf 'FAIL: check-deps --without %s passed:\n%s\n' "$pkg" "$out"
    status=1
  elif [[ "$out" != *"package $pkg is used by the build"* || "$out" != *"$file"* ]]; then
    printf 'FAIL: check-deps --without %s should name %s and %s:\n%s\n' "$pkg" "$pkg" "$file" "$out"
    status=1
  else
    echo "ok: without $pkg it fails naming $pkg and $file"
  fi
}
expect_failure libdnnl-dev /usr/include/dnnl.h  # one of oneDNN's headers (dnnl.h or dnnl.hpp)
expect_failure ocl-icd-opencl-dev libOpenCL.so
expect_failure dataset-fashion-mnist /usr/share/datasets/fashion-mnist
expect_failure ccache /usr/bin/ccache
exit $status
