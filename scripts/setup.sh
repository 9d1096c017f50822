#!/usr/bin/env bash
# setup.sh — installs the Debian packages Turbine needs (when missing) and
# builds it in Release mode into build/. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake pkg-config libjansson-dev libpcre2-dev libxxhash-dev
      libopenblas-dev libmicrohttpd-dev python3-numpy libcurl4-openssl-dev
      protobuf-c-compiler libprotobuf-c-dev python3-onnx
      libgrpc-dev) # serve --grpc-port: gRPC's headers at build time, libgrpc29 loaded when used
if [ "${TURBINE_TEST_DEPS:-0}" = 1 ]; then
  PKGS+=(wrk chromium prometheus clang libclang-rt-dev) # clang: the fuzz harnesses (tests/fuzz)
  PKGS+=(nginx curl) # tests/test_cluster.sh: replicas behind nginx (scripts/cluster.sh)
  PKGS+=(python3-grpcio python3-grpc-tools) # the gRPC client of tests/test_kserve_grpc.sh
  # the ONNX tests (tests/onnx): models exported with PyTorch, ONNX's node tests
  PKGS+=(python3-onnx libonnx-testdata python3-torch python3-torchvision)
  # Node.js may come from elsewhere with its own npm: only ask Debian when absent.
  command -v node >/dev/null 2>&1 || PKGS+=(nodejs)
  command -v npm >/dev/null 2>&1 || PKGS+=(npm)
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
