#!/bin/sh
# Installs what `make rpc-server` builds llama.cpp's RPC worker and backend with: Debian's
# `cmake` and `g++` through apt. Never fails: where it cannot install, it says why; the build
# then says what is missing and the RPC split tests skip, naming `make rpc-server`.
if command -v cmake >/dev/null 2>&1 && command -v c++ >/dev/null 2>&1; then exit 0; fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup-build-tools: no apt-get here; install cmake and a C++ compiler yourself (make rpc-server needs them)" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
        echo "setup-build-tools: not root and no password-less sudo; run 'sudo apt-get install -y cmake g++' (make rpc-server needs them)" >&2
        exit 0
    fi
fi
install() {
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends cmake g++ make >/dev/null 2>&1
}
echo "setup-build-tools: installing Debian's cmake and g++ with apt" >&2
if ! install; then
    $SUDO apt-get update -q >/dev/null 2>&1
    install || echo "setup-build-tools: apt-get install cmake g++ failed; the RPC split tests will skip" >&2
fi
exit 0
