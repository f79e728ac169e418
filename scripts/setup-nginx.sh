#!/bin/sh
# Installs nginx, which the reverse-proxy streaming test puts in front of the daemon: Debian's
# `nginx-light` (or `nginx-core`, or `nginx`) through apt. The test runs it unprivileged with a
# config of its own, so nothing here starts or enables the system service. Never fails: where it
# cannot install, it says why; the test then fails, naming `make nginx`.
if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then exit 0; fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup-nginx: no apt-get here; install nginx yourself (the reverse-proxy streaming test fails without it)" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
        echo "setup-nginx: not root and no password-less sudo; run 'sudo apt-get install -y nginx-light' (the reverse-proxy streaming test fails without it)" >&2
        exit 0
    fi
fi
install() {
    for pkg in nginx-light nginx-core nginx; do
        # RUNLEVEL=1: the package's scripts do not start the system's nginx on port 80
        DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $SUDO apt-get install -y -q --no-install-recommends "$pkg" \
            >/dev/null 2>&1 && return 0
    done
    return 1
}
echo "setup-nginx: installing Debian's nginx with apt" >&2
if ! install; then
    $SUDO apt-get update -q >/dev/null 2>&1
    install || echo "setup-nginx: apt-get install nginx failed; the reverse-proxy streaming test will fail" >&2
fi
exit 0
