#!/bin/sh
# Installs the browser the web console's tests drive: Debian's `chromium`, through apt.
# Never fails: where it cannot install, it says why and the browser tests fail, naming this script.
if [ -n "$BLAZAR_CHROMIUM" ] && [ -x "$BLAZAR_CHROMIUM" ]; then exit 0; fi
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup-browser: no apt-get here; install Chromium yourself and set BLAZAR_CHROMIUM (the browser tests fail without it)" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
        echo "setup-browser: not root and no password-less sudo; run 'sudo apt-get install -y chromium' (the browser tests fail without it)" >&2
        exit 0
    fi
fi
echo "setup-browser: installing Debian's chromium with apt" >&2
if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium >/dev/null 2>&1; then
    $SUDO apt-get update -q >/dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium >/dev/null 2>&1 ||
        echo "setup-browser: apt-get install chromium failed; the browser tests will fail" >&2
fi
exit 0
