# Functions that stop and inspect gmount daemons on a node, in POSIX sh (no Python needed).
# The launcher sends this file on the stdin of `sh`, followed by calls such as
#   term n1:4242 n2:4243; settle 150 n1:4242 n2:4243; unmount n1 /mnt/n1 /mnt/n1
#   check n1 4242 /mnt/n1
# and reads the "GMOUNT ..." lines they print. NODE:PID pairs name each daemon.

# ours PID: the process is this user's and a gmount daemon (pids get reused).
ours() { [ -O "/proc/$1" ] && tr '\0' '\n' < "/proc/$1/cmdline" 2>/dev/null | grep -qx 'gmountpy.node'; }

# is_mounted ESCAPED: a mount point, spelled as /proc/self/mounts spells it, is mounted.
is_mounted() {
  awk 'BEGIN { m = ARGV[1]; ARGV[1] = "" } $2 == m { found = 1 } END { exit !found }' "$1" /proc/self/mounts
}

# term NODE:PID...: SIGTERM each daemon that is ours.
term() {
  for np in "$@"; do ours "${np#*:}" && kill -TERM "${np#*:}" 2>/dev/null && echo "GMOUNT TERM $np"; done
  return 0
}

# settle TENTHS NODE:PID...: wait up to TENTHS tenths of a second for them to end, then SIGKILL the rest.
settle() {
  n=$1; shift
  left=""
  while :; do
    left=""
    for np in "$@"; do if ours "${np#*:}"; then left="$left $np"; fi; done
    [ -z "$left" ] && return 0
    [ "$n" -le 0 ] && break
    n=$((n - 1))
    sleep 0.1 2>/dev/null || sleep 1
    # shellcheck disable=SC2086  # split the list back into arguments
    set -- $left
  done
  for np in $left; do kill -KILL "${np#*:}" 2>/dev/null; echo "GMOUNT KILLED $np"; done
  sleep 0.2 2>/dev/null || sleep 1
}

# abort ESCAPED: abort the FUSE connection mounted there (fusectl, where it is mounted), so processes
# waiting in a dead daemon's mount get ENOTCONN: a daemon killed while a thread of it waits in the
# kernel never finishes exiting, and its /dev/fuse stays open.
abort() {
  dev=$(awk 'BEGIN { m = ARGV[1]; ARGV[1] = "" } $5 == m { d = $3 } END { print d }' "$1" /proc/self/mountinfo)
  case "$dev" in
    0:*) if [ -w "/sys/fs/fuse/connections/${dev#0:}/abort" ]; then
           echo 1 > "/sys/fs/fuse/connections/${dev#0:}/abort" 2>/dev/null; fi ;;
  esac
  return 0
}

# unmount NODE MOUNTPOINT ESCAPED: lazily unmount a mount point that is still mounted (its daemon
# is gone: its connection is aborted first).
unmount() {
  if is_mounted "$3"; then
    abort "$3"
    if out=$(fusermount3 -u -z "$2" 2>&1); then echo "GMOUNT UNMOUNTED $1"
    else echo "GMOUNT UNMOUNT-FAILED $1 $(echo "$out" | tr '\n' ' ')"; fi
  fi
}

# unseal MOUNTPOINT ESCAPED: the directory a dead daemon's mount covered is unwritable
# (gmountpy.node.directories): writable again once nothing is mounted there.
unseal() {
  if ! is_mounted "$2" && [ -d "$1" ]; then chattr -i "$1" 2>/dev/null; chmod u+w "$1" 2>/dev/null; fi
  return 0
}

# check NODE PID ESCAPED: "GMOUNT CHECK NODE ALIVE MOUNTED" (1 or 0 each).
check() {
  a=0; m=0
  if [ "$2" -gt 0 ] && ours "$2"; then a=1; fi
  if is_mounted "$3"; then m=1; fi
  echo "GMOUNT CHECK $1 $a $m"
}
