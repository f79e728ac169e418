#!/bin/sh
# Installs ffmpeg, which the piper host encodes mp3, opus, aac and flac with: Debian's `ffmpeg`
# through apt. Never fails: where it cannot install, it says why; those formats then answer 400
# (install ffmpeg) and the tests of them fail, naming this script.
if command -v ffmpeg >/dev/null 2>&1; then exit 0; fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup-ffmpeg: no apt-get here; install ffmpeg yourself (the lossy speech format tests fail without it)" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
        echo "setup-ffmpeg: not root and no password-less sudo; run 'sudo apt-get install -y ffmpeg' (the lossy speech format tests fail without it)" >&2
        exit 0
    fi
fi
echo "setup-ffmpeg: installing Debian's ffmpeg with apt" >&2
if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends ffmpeg >/dev/null 2>&1; then
    $SUDO apt-get update -q >/dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends ffmpeg >/dev/null 2>&1 ||
        echo "setup-ffmpeg: apt-get install ffmpeg failed; the lossy speech format tests will fail" >&2
fi
exit 0
