#!/usr/bin/env bash
# Run a command at the lowest priority: nice 19, in a session of its own whose scheduling group
# is at nice 19 too. On Linux with autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled)
# the scheduler first shares the CPUs between sessions, each weighed at its group's nice (0 unless
# set); a process's own nice only orders it within its session. So `nice -n 19 COMMAND` alone
# still takes an equal share from every other session, e.g. from each worker make test's notebook
# half starts. Ctrl-C, and make stopping, reach the command's whole session; its exit status is
# this script's. Where there is no autogroup, this is nice -n 19 in a new session.
set -u
[ $# -gt 0 ] || { echo "usage: scripts/low-priority.sh COMMAND [ARG...]" >&2; exit 2; }
python=$(command -v python3 || command -v python)
# a background job of a script is no process group leader, so os.setsid() makes it one: its pid
# is the new session's and process group's id
# (and a background job starts with SIGINT ignored, which the command would inherit: restored)
"$python" -c '
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.setsid()
try:
    with open("/proc/self/autogroup", "w") as f:
        f.write("19")
except OSError:
    pass
os.nice(19)
os.execvp(sys.argv[1], sys.argv[1:])
' "$@" &
pid=$!
trap 'kill -INT -- -$pid 2>/dev/null' INT
trap 'kill -TERM -- -$pid 2>/dev/null' TERM HUP
while :; do
    wait $pid
    status=$?
    kill -0 $pid 2>/dev/null || break  # a trapped signal ends wait early: wait again until it exits
done
exit $status
