#!/usr/bin/env bash
# Install numactl, jemalloc and tcmalloc when missing: with apt when running as root,
# otherwise print what to install and carry on (the workbook measures what is there).
# Extra Debian packages named as arguments (e.g. chromium, for the report's browser test)
# are installed the same way when their command is missing.
set -u
missing=()
for extra in "$@"; do command -v "$extra" >/dev/null 2>&1 || missing+=("$extra"); done
command -v numactl >/dev/null 2>&1 || missing+=(numactl)
libs=$(/sbin/ldconfig -p 2>/dev/null || ldconfig -p 2>/dev/null || true)
grep -q "libjemalloc\.so" <<<"$libs" || missing+=(libjemalloc2)
grep -q "libtcmalloc" <<<"$libs" || missing+=(libtcmalloc-minimal4)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "cpuopt: installing ${missing[*]} with apt-get"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; }; then
        echo "cpuopt: warning: apt-get could not install ${missing[*]}; the notebooks will skip what is missing"
    fi
else
    echo "cpuopt: missing ${missing[*]}; install with: sudo apt-get install ${missing[*]}"
    echo "cpuopt: carrying on; the notebooks measure what is installed and say what they skipped"
fi
exit 0
