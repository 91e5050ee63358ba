# Sourced by the scripts that start oombd in the background and then talk to it (bench/load,
# bench/gpu_*.sh): waits for the port files the daemon writes once it listens
# (docs/CONVENTIONS.md §2: oombd.port last), and fails at a deadline with a message naming the
# file, the time waited and the daemon's log, never going on with an empty port.
#
#   wait_for_daemon DATA_DIR PID LOG [SECONDS] [FILE ...]
#     DATA_DIR  the daemon's data dir; PID its process; LOG the file its stderr goes to
#     SECONDS   the deadline (default: $OOMB_DAEMON_START_SECONDS, else 120; a busy 2-core
#               machine with ctest running in parallel took over 10 s)
#     FILE      the port files to wait for (default: oombd.port); each must be non-empty
# Returns 0 once every file is there; otherwise prints why on stderr and returns 1: the daemon
# exited (with its status), or the deadline passed.
wait_for_daemon() {
  local dir="$1" pid="$2" log="$3" seconds="${4:-${OOMB_DAEMON_START_SECONDS:-120}}"
  shift 4 2>/dev/null || shift $#
  local files=("$@")
  ((${#files[@]})) || files=(oombd.port)
  local deadline=$((SECONDS + seconds)) f missing
  while :; do
    missing=""
    for f in "${files[@]}"; do [ -s "$dir/$f" ] || { missing="$f"; break; }; done
    [ -z "$missing" ] && return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      local rc=0
      wait "$pid" 2>/dev/null || rc=$?
      echo "wait_for_daemon: oombd (pid $pid) exited with status $rc before writing $dir/$missing; its log ($log):" >&2
      tail -n 40 "$log" >&2 2>/dev/null || true
      return 1
    fi
    if ((SECONDS >= deadline)); then
      echo "wait_for_daemon: oombd (pid $pid) wrote no $dir/$missing within $seconds s; its log ($log):" >&2
      tail -n 40 "$log" >&2 2>/dev/null || true
      return 1
    fi
    sleep 0.1
  done
}
