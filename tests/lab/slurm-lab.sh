#!/usr/bin/env bash
# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# slurm-lab.sh - a throw-away, real Slurm cluster on one host, loopback only.
#
#   munged + slurmctld + N x `slurmd -N nodeK` (fake GRES gpu:<type>:8, files are /dev/null symlinks),
#   everything under one private directory ($SLURM_LAB_DIR), every daemon stopped by verified PID.
#
# Usage: slurm-lab.sh start|stop|restart|status|env|wait|selftest|clean
# Settings (environment, defaults in brackets):
#   SLURM_LAB_PORT_BASE [16800]  ctld=BASE+17 restd=BASE+20 slurmd i=BASE+100+i  (16800 is a person's `make lab`;
#                          tests take blocks of 200 ports from 20000 on through tests/support/labs.py, never this one)
#   SLURM_LAB_OWNER [person:<user>]  who holds the lab: written to $LAB/owner at start; `start` refuses to attach to
#                          a running lab with another owner (a test never reuses a person's lab, nor one another's)
#   SLURM_LAB_OWNER_NOTE [unset]  a line for people: what the lab is for (shown when another owner is refused)
#   SLURM_LAB_DIR [/tmp/gpufleet-lab-$SLURM_LAB_PORT_BASE]   SLURM_LAB_NODES [4]   SLURM_LAB_NODE_PREFIX [node]
#   SLURM_LAB_GPUS [8]  SLURM_LAB_GPU_TYPE [h100]  SLURM_LAB_CPUS [16]  SLURM_LAB_MEM_MB [64000]
#   SLURM_LAB_HEALTHCHECK_PROGRAM [$LAB/bin/healthcheck]  SLURM_LAB_HEALTHCHECK_INTERVAL [5; 0 = off]
#   SLURM_LAB_REBOOT_PROGRAM [$LAB/bin/fake-reboot]  SLURM_LAB_EPILOG [$LAB/bin/epilog; none = no Epilog]
#   SLURM_LAB_JWKS [unset: no slurmrestd]
#   SLURM_LAB_EXTRA_CONF [unset: file appended verbatim to slurm.conf]  SLURM_LAB_INSTALL [auto|no]
#   SLURM_LAB_TIMEOUT [60: seconds for the nodes]  SLURM_LAB_CTLD_TIMEOUT [60: seconds for slurmctld to answer]
#   SLURM_LAB_SLURMD_TIMEOUT [30]  SLURM_LAB_KEEP_STATE [0]
#   SLURM_LAB_ACCOUNTING [0 | 1 = real accounting: MariaDB (the host's, datadir in the lab, port BASE+30) and
#                          slurmdbd (the release's, port BASE+19); sacct and sacctmgr then read real records]
#   SLURM_LAB_RELEASE [22.05 = the host's Debian Slurm | 24.11 = Debian trixie chroot]
#   SLURM_LAB_CHROOT [/var/cache/gpufleet/trixie-chroot]  (built once with debootstrap, then reused)
#   SLURM_LAB_CHROOT_BINDS [/tmp /work /root /home /opt /srv]  host dirs bound at the same path in the chroot
#                          (the checkout holding this script is added when none of them covers it)
#   SLURM_LAB_CHROOT_USERS [host = the chroot's /etc/passwd and /etc/group hold the host's, as a cluster node sees
#                          the site's directory: tests' local users exist for the 24.11 daemons too | chroot]
#                          (copied in place - same inode, never renamed or bind-mounted - at every chroot command:
#                          mounts can outlive their namespace here, and a file bind pins an inode that useradd
#                          replaces, which broke every later mount on that path)
#
# The health-check program drains a node when $LAB/flags/<node>.bad exists, then, if $LAB/etc/healthcheck.hook
# exists and is executable, execs it (PATH and SLURM_CONF exported, SLURMD_NODENAME passed through). The
# Epilog does the same with $LAB/etc/epilog.hook (SLURM_JOB_ID etc. passed through): a hook that sleeps keeps
# the job COMPLETING. With release 24.11 the hooks run on the host (outside the chroot) with $LAB/bin/wrap
# first on PATH.
#
# Every wait is bounded by time on the monotonic clock (/proc/uptime), never by a count of attempts, and every
# Slurm client call made while waiting has its own time limit: under load one `scontrol ping` through the
# 24.11 wrapper (unshare + bind mounts + chroot) can take seconds, and 300 attempts once took 10 minutes.
# munged logs "Unauthorized credential for client UID=0 GID=0" once per Slurm daemon start: that is Slurm's own
# probe of munged's root-decode setting, not a failure; when slurmctld does not answer, the script prints the
# last ping answer and the logs that say why.
set -euo pipefail
# The daemons get descriptors 0-2 open whatever this script was given: a daemon started with one of them closed opens
# its log file as that descriptor and loses it when it daemonizes (Slurm 22.05's slurmd logged two lines, then
# nothing), and slurmd then starts slurmstepd on a pipe it does not feed ("Failed to read conf from slurmd": no job of
# the lab could start). Seen when a test process had closed its standard input. Nothing here reads standard input.
exec </dev/null
[[ -e /proc/$$/fd/1 ]] || exec >/dev/null
[[ -e /proc/$$/fd/2 ]] || exec 2>/dev/null

PORT_BASE=${SLURM_LAB_PORT_BASE:-16800}
LAB=${SLURM_LAB_DIR:-/tmp/gpufleet-lab-$PORT_BASE}
NODES=${SLURM_LAB_NODES:-4}
PREFIX=${SLURM_LAB_NODE_PREFIX:-node}
GPUS=${SLURM_LAB_GPUS:-8}
GPU_TYPE=${SLURM_LAB_GPU_TYPE:-h100}
CPUS=${SLURM_LAB_CPUS:-16}
MEM_MB=${SLURM_LAB_MEM_MB:-64000}
HC_PROGRAM=${SLURM_LAB_HEALTHCHECK_PROGRAM:-$LAB/bin/healthcheck}
HC_INTERVAL=${SLURM_LAB_HEALTHCHECK_INTERVAL:-5}
REBOOT_PROGRAM=${SLURM_LAB_REBOOT_PROGRAM:-$LAB/bin/fake-reboot}
EPILOG=${SLURM_LAB_EPILOG:-$LAB/bin/epilog}
JWKS=${SLURM_LAB_JWKS:-}
EXTRA_CONF=${SLURM_LAB_EXTRA_CONF:-}
INSTALL=${SLURM_LAB_INSTALL:-auto}
TIMEOUT=${SLURM_LAB_TIMEOUT:-60}
CTLD_TIMEOUT=${SLURM_LAB_CTLD_TIMEOUT:-60}
SLURMD_TIMEOUT=${SLURM_LAB_SLURMD_TIMEOUT:-30}
KEEP_STATE=${SLURM_LAB_KEEP_STATE:-0}
ACCOUNTING=${SLURM_LAB_ACCOUNTING:-0}
OWNER=${SLURM_LAB_OWNER:-person:$(id -un)}
OWNER_NOTE=${SLURM_LAB_OWNER_NOTE:-started with slurm-lab.sh by $(id -un)}
RELEASE=${SLURM_LAB_RELEASE:-22.05}
CHROOT=${SLURM_LAB_CHROOT:-/var/cache/gpufleet/trixie-chroot}
CHROOT_BINDS=${SLURM_LAB_CHROOT_BINDS:-/tmp /work /root /home /opt /srv}
CHROOT_USERS=${SLURM_LAB_CHROOT_USERS:-host}
# The checkout this script belongs to is always seen inside too, wherever it lives (CI clones outside /work):
# job scripts that name .venv/bin/python, the simulator's sweep among them, run from it.
CHECKOUT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
case " $CHROOT_BINDS " in
  *" $CHECKOUT "*) ;;
  *) covered=0
     for d in $CHROOT_BINDS; do [[ "$CHECKOUT/" == "$d"/* ]] && covered=1; done
     ((covered)) || CHROOT_BINDS="$CHROOT_BINDS $CHECKOUT" ;;
esac

CONF=$LAB/etc/slurm.conf
CTLD_PORT=$((PORT_BASE + 17))
DBD_PORT=$((PORT_BASE + 19))
RESTD_PORT=$((PORT_BASE + 20))
DB_PORT=$((PORT_BASE + 30))
DB_DIR=$LAB/mysql
SYS_PATH=/usr/sbin:/usr/bin:/sbin:/bin
CONF_CHANGED=0

die() { echo "slurm-lab: $*" >&2; exit 1; }
log() { echo "slurm-lab: $*" >&2; }
# Milliseconds on the monotonic clock (CLOCK_BOOTTIME through /proc/uptime): deadlines never move with the wall clock.
now_ms() {
  local up
  read -r up _ </proc/uptime
  echo $((10#${up/./} * 10))
}
# deadline SECONDS: the monotonic time (ms) SECONDS from now; past DEADLINE: true once it has passed.
deadline() { echo $(($(now_ms) + $1 * 1000)); }
past() { (($(now_ms) >= $1)); }

# A lab keeps the release it was started with: stop/status/wait/env/selftest/clean follow it, restart too
# unless SLURM_LAB_RELEASE says otherwise; start uses SLURM_LAB_RELEASE (default 22.05).
RECORDED=""
[[ -f "$LAB/etc/release" ]] && RECORDED=$(cat "$LAB/etc/release")
case "${1:-}" in
  start) ;;
  restart) RELEASE=${SLURM_LAB_RELEASE:-${RECORDED:-22.05}} ;;
  *) RELEASE=${RECORDED:-$RELEASE} ;;
esac
case "$RELEASE" in
  22.05 | host) RELEASE=22.05; ROOT="" ;;
  24.11) ROOT=$CHROOT ;;
  *) die "SLURM_LAB_RELEASE must be 22.05 or 24.11, got '$RELEASE'" ;;
esac
[[ "$NODES" =~ ^[1-9][0-9]*$ ]] || die "SLURM_LAB_NODES must be a positive integer, got '$NODES'"
[[ "$PORT_BASE" =~ ^[1-9][0-9]*$ ]] || die "SLURM_LAB_PORT_BASE must be a positive integer, got '$PORT_BASE'"
[[ "$HC_INTERVAL" =~ ^[0-9]+$ ]] || die "SLURM_LAB_HEALTHCHECK_INTERVAL must be an integer >= 0"
[[ "$ACCOUNTING" == 0 || "$ACCOUNTING" == 1 ]] || die "SLURM_LAB_ACCOUNTING must be 0 or 1, got '$ACCOUNTING'"
for v in TIMEOUT CTLD_TIMEOUT; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "SLURM_LAB_$v must be a positive number of seconds, got '${!v}'"
done
[[ "$LAB" == /* ]] || die "SLURM_LAB_DIR must be an absolute path, got '$LAB'"
[[ "$OWNER" =~ ^[A-Za-z0-9_.:@-]+$ ]] || die "SLURM_LAB_OWNER must be letters, digits and _.:@- only, got '$OWNER'"
[[ "$CHROOT_USERS" == host || "$CHROOT_USERS" == chroot ]] ||
  die "SLURM_LAB_CHROOT_USERS must be host or chroot, got '$CHROOT_USERS'"

node_names() { local i; for ((i = 1; i <= NODES; i++)); do echo "$PREFIX$i"; done; }
hostlist() { if ((NODES == 1)); then echo "${PREFIX}1"; else echo "${PREFIX}[1-$NODES]"; fi; }
slurmd_port() { echo $((PORT_BASE + 100 + ${1#"$PREFIX"})); }

# --- running things inside (24.11) or outside (22.05) the chroot --------------------------------------------
# A client command: through the lab's wrappers when a chroot is in use, else the host's binary.
client() {
  local cmd=$1; shift
  # SLURM_CONF is always this lab's: a caller's environment may name another lab (a second lab started from a test
  # that runs inside the first one's environment, as the storm lab does), and the wrapper keeps a SLURM_CONF it is given.
  if [[ -n "$ROOT" ]]; then
    SLURM_CONF=$CONF "$LAB/bin/wrap/$cmd" "$@"
  else
    # the host's own binaries, never a wrapper of another (24.11) lab that happens to be first on PATH
    PATH=$SYS_PATH SLURM_CONF=$CONF "$cmd" "$@"
  fi
}
# client_t SECONDS CMD ARGS...: a client command that is killed after SECONDS (rc 124), for calls made in waits.
client_t() {
  local secs=$1 cmd=$2; shift 2
  if [[ -n "$ROOT" ]]; then
    timeout -k 2 "$secs" env SLURM_CONF="$CONF" "$LAB/bin/wrap/$cmd" "$@"
  else
    timeout -k 2 "$secs" env PATH=$SYS_PATH SLURM_CONF="$CONF" "$cmd" "$@"
  fi
}
# A daemon: started in its own private mount namespace inside the chroot (mounts die with the namespace).
daemon() {
  if [[ -n "$ROOT" ]]; then
    SLURM_CONF=$CONF PATH=$SYS_PATH "$LAB/bin/chroot-exec" daemon "$@"
  else
    SLURM_CONF=$CONF PATH=$SYS_PATH "$@"
  fi
}
# Resolved path of a binary as /proc/PID/exe shows it from the host.
binary_path() {
  if [[ -n "$ROOT" ]]; then
    echo "$ROOT$(chroot "$ROOT" readlink -f "$1")"
  else
    readlink -f "$1"
  fi
}

# --- PID safety --------------------------------------------------------------------------------------------
# verified_pid PIDFILE BINARY [prune]: print the PID if it is alive, runs BINARY ("*": any, for a stray found by its
# command line; "host:PATH": the host's PATH for either release) and belongs to this lab. Nothing
# is ever signalled by name. Only stop passes "prune", which removes a stale PID file: a check that only looks
# must not, because Slurm >= 23.11 re-execs slurmctld on reconfigure and the new process writes its PID over the
# old one's - a look that read the old PID, found it gone and removed the file would remove the new PID with it,
# and the lab would lose track of a running slurmctld.
verified_pid() {
  local pidfile=$1 binary=$2 prune=${3:-} pid exe
  [[ -f "$pidfile" ]] || return 1
  pid=$(tr -dc '0-9' <"$pidfile" 2>/dev/null || true)
  if [[ -z "$pid" || ! -d /proc/$pid ]]; then [[ -z "$prune" ]] || rm -f "$pidfile"; return 1; fi
  if ! tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -Fxq "SLURM_CONF=$CONF" &&
    ! tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline" | grep -Fq "$LAB"; then
    [[ -z "$prune" ]] || rm -f "$pidfile"  # a recycled PID: not ours
    return 1
  fi
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
  exe=${exe% (deleted)}
  if [[ "$binary" == host:* ]]; then  # a host program whatever the release (MariaDB): that binary, on the host
    [[ "$exe" == "$(readlink -f "${binary#host:}")" ]] || return 1
  elif [[ "$binary" != "*" && "$exe" != "$(binary_path "$binary")" ]]; then
    # Ours, but another binary (a lab of the other release in this directory): keep the PID file.
    [[ "$exe" == */"${binary##*/}"* ]] && log "pid $pid in $pidfile runs $exe, not $(binary_path "$binary")"
    [[ "$exe" == */"${binary##*/}"* || -z "$prune" ]] || rm -f "$pidfile"
    return 1
  fi
  echo "$pid"
}

# lab_munged_cmd CMDLINE: the command line (NULs as spaces) of a munged of this lab: it names this lab's socket.
lab_munged_cmd() { [[ "$1" == *"/usr/sbin/munged "*"--socket=$LAB/munge/"* ]]; }

# adopt_munged PID: this lab's own munged (its command line names the lab's socket, it runs this release's binary)
# that munged.pid does not name: the PID file names it from now on.
adopt_munged() {
  log "munged pid $1 runs for this lab but $LAB/run/munged.pid does not name it ($(cat "$LAB/run/munged.pid" \
    2>/dev/null || echo missing)): adopting it"
  echo "$1" >"$LAB/run/munged.pid"
}

# stop_strays: Slurm daemons of this lab (their command line names this lab's slurm.conf), and a munged whose
# socket is this lab's that runs another release's binary (a lab of that release in this directory left it) or is a
# second one beside the munged the PID file names - a run killed between a daemon's start and its PID file - stopped
# by PID like the others. Without this a stray slurmctld keeps the lab's port and every later start fails.
# A munged of this lab and this release that its PID file does not name (the file gone, stale, or naming another
# process) is this lab's munged, not a stray: it is adopted, as start_munged would adopt it, and never signalled
# (a test that froze it to make slurmctld unanswerable must find it frozen, not replaced).
stop_strays() {
  local p cmd exe own_munged
  local -a specs=()
  own_munged=$(munged_pid || true)  # this lab's own munged (its PID file, this release): never a stray
  for p in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline") || continue  # the process may be gone by now: say nothing
    case "$cmd" in
      *"/usr/sbin/slurm"*" -f $CONF "* | *"/usr/sbin/slurm"*" -f $CONF") ;;
      *"/usr/sbin/mariadbd "*"--datadir=$DB_DIR "*) ;;
      *"/usr/sbin/munged "*)
        if ! lab_munged_cmd "$cmd" || [[ "${p#/proc/}" == "$own_munged" ]]; then continue; fi
        exe=$(readlink "$p/exe" 2>/dev/null || true)
        if [[ -z "$own_munged" && "${exe% (deleted)}" == "$(binary_path /usr/sbin/munged)" ]]; then
          adopt_munged "${p#/proc/}"
          own_munged=${p#/proc/}
          continue
        fi ;;
      *) continue ;;
    esac
    echo "${p#/proc/}" >"$LAB/run/stray-${p#/proc/}.pid"
    # any binary ("*"): its command line names this lab, whichever release ran it (a munged of the other release,
    # left running by a lab of that release in this directory, keeps the socket and every later start fails)
    specs+=("stray ${cmd%% *}:$LAB/run/stray-${p#/proc/}.pid:*")
  done
  ((${#specs[@]})) || return 0
  stop_pids "${specs[@]}"
}

# stop_pids NAME:PIDFILE:BINARY...: SIGTERM all verified PIDs together, 15 s, then SIGKILL; remove PID files.
stop_pids() {
  local spec name pidfile binary pid deadline alive
  local -a pids=() files=()
  for spec in "$@"; do
    IFS=: read -r name pidfile binary <<<"$spec"
    if pid=$(verified_pid "$pidfile" "$binary" prune); then
      log "stopping $name (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid"); files+=("$pidfile")
    fi
  done
  ((${#pids[@]})) || return 0
  deadline=$(deadline 15)
  while :; do
    alive=()
    for pid in "${pids[@]}"; do [[ -d /proc/$pid ]] && alive+=("$pid"); done
    ((${#alive[@]})) || break
    if past "$deadline"; then
      for pid in "${alive[@]}"; do log "pid $pid did not stop, SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; done
      break
    fi
    sleep 0.1
  done
  rm -f "${files[@]}"
}

port_busy() {
  local hex
  hex=$(printf '%04X' "$1")
  awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# --- installation ------------------------------------------------------------------------------------------
install_host_packages() {
  local -a pkgs=(munge slurmctld slurmd slurm-client)
  [[ -n "$JWKS" ]] && pkgs+=(slurmrestd slurm-wlm-jwt-plugin)
  ((ACCOUNTING)) && pkgs+=(slurmdbd)
  apt_install_host "${pkgs[@]}"
}

# apt_install_host PKG...: install the packages the host lacks (services are not started: policy-rc.d says no).
apt_install_host() {
  local -a pkgs=("$@") missing=()
  local p created_policy=0 rc=0
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  [[ "$INSTALL" == auto ]] || die "missing packages: ${missing[*]} (SLURM_LAB_INSTALL=no)"
  log "installing ${missing[*]}"
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; created_policy=1
  fi
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"; } >"/tmp/slurm-lab-apt.$$.log" 2>&1 || rc=$?
  ((created_policy)) && rm -f /usr/sbin/policy-rc.d
  if ((rc)); then cat "/tmp/slurm-lab-apt.$$.log" >&2; rm -f "/tmp/slurm-lab-apt.$$.log"; die "apt-get failed"; fi
  rm -f "/tmp/slurm-lab-apt.$$.log"
}

# The Slurm 24.11 userland: a Debian trixie chroot, built once (debootstrap + apt) and reused.
build_chroot() {
  [[ -f "$ROOT/.gpufleet-ready" ]] && return 0
  [[ "$INSTALL" == auto ]] || die "no trixie chroot at $ROOT (SLURM_LAB_INSTALL=no)"
  command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
  local parent tmp
  parent=$(dirname "$ROOT"); tmp="$ROOT.tmp"
  mkdir -p "$parent"
  exec 9>"$parent/.build.lock"
  flock 9
  if [[ ! -f "$ROOT/.gpufleet-ready" ]]; then
    log "building the Slurm 24.11 chroot at $ROOT (once; about a minute)"
    if [[ ! -x "$tmp/usr/bin/apt-get" ]]; then
      rm -rf "$tmp"
      debootstrap --variant=minbase --include=ca-certificates trixie "$tmp" http://deb.debian.org/debian \
        >"$parent/debootstrap.log" 2>&1 || { tail -20 "$parent/debootstrap.log" >&2; die "debootstrap failed"; }
    fi
    printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"; chmod 755 "$tmp/usr/sbin/policy-rc.d"
    cp /etc/hosts "$tmp/etc/hosts"; cp /etc/resolv.conf "$tmp/etc/resolv.conf" 2>/dev/null || true
    # shellcheck disable=SC2016  # expanded by the inner shell
    unshare --mount --propagation private -- sh -c '
      mount -t proc proc "$1/proc" && mount --rbind /dev "$1/dev" && mount --rbind /sys "$1/sys" &&
      chroot "$1" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
        sh -c "apt-get update -qq && apt-get install -y -qq --no-install-recommends \
               munge slurmctld slurmd slurm-client slurmrestd slurm-wlm-jwt-plugin slurmdbd"' sh "$tmp" \
      >"$parent/chroot-apt.log" 2>&1 || { tail -30 "$parent/chroot-apt.log" >&2; die "apt-get in the chroot failed"; }
    rm -f "$tmp/usr/sbin/policy-rc.d"
    # shellcheck disable=SC2016  # dpkg-query format
    chroot "$tmp" dpkg-query -W -f='slurmctld ${Version}\n' slurmctld >"$tmp/.gpufleet-ready"
    rm -rf "$ROOT"; mv "$tmp" "$ROOT"
    log "chroot ready: $(cat "$ROOT/.gpufleet-ready")"
  fi
  exec 9>&-
}

# The accounting parts: MariaDB from the host's packages (for both releases: slurmdbd talks to it over loopback
# TCP) and slurmdbd of the lab's release (in the chroot for 24.11; a chroot built before slurmdbd was in its list
# gets it added once, under the build lock).
install_accounting_packages() {
  apt_install_host mariadb-server mariadb-client
  [[ -n "$ROOT" ]] || return 0
  [[ -x "$ROOT/usr/sbin/slurmdbd" ]] && return 0
  [[ "$INSTALL" == auto ]] || die "no slurmdbd in the chroot at $ROOT (SLURM_LAB_INSTALL=no)"
  local parent
  parent=$(dirname "$ROOT")
  exec 9>"$parent/.build.lock"
  flock 9
  if [[ ! -x "$ROOT/usr/sbin/slurmdbd" ]]; then
    log "adding slurmdbd to the chroot at $ROOT (once)"
    printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"; chmod 755 "$ROOT/usr/sbin/policy-rc.d"
    # shellcheck disable=SC2016  # expanded by the inner shell
    unshare --mount --propagation private -- sh -c '
      mount -t proc proc "$1/proc" && mount --rbind /dev "$1/dev" &&
      chroot "$1" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
        sh -c "apt-get update -qq && apt-get install -y -qq --no-install-recommends slurmdbd"' sh "$ROOT" \
      >"$parent/chroot-apt-slurmdbd.log" 2>&1 || { rm -f "$ROOT/usr/sbin/policy-rc.d"; exec 9>&-
        tail -30 "$parent/chroot-apt-slurmdbd.log" >&2; die "apt-get install slurmdbd in the chroot failed"; }
    rm -f "$ROOT/usr/sbin/policy-rc.d"
  fi
  exec 9>&-
}

# slurm.conf's accounting lines: slurmdbd on loopback when SLURM_LAB_ACCOUNTING=1, else none.
accounting_conf() {
  if ((ACCOUNTING)); then
    printf 'AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\n'
    # with slurmdbd, AccountingStoragePass names the munge socket for the connections to it (Slurm's slurm.conf)
    printf 'AccountingStoragePort=%s\nAccountingStoragePass=%s\n' "$DBD_PORT" "$LAB/munge/munge.socket.2"
  else
    echo "AccountingStorageType=accounting_storage/none"
  fi
}

# --- configuration -----------------------------------------------------------------------------------------
# write_if_changed FILE MODE: content on stdin; returns 0 when the file changed.
write_if_changed() {
  local file=$1 mode=$2 tmp
  tmp=$(mktemp "$file.XXXXXX")
  cat >"$tmp"
  chmod "$mode" "$tmp"
  if [[ -f "$file" ]] && cmp -s "$tmp" "$file"; then rm -f "$tmp"; return 1; fi
  mv -f "$tmp" "$file"
}

write_programs() {
  local hook_prefix=""
  # With a chroot, the hook runs on the host (/.host is the host's root inside the daemons' namespace).
  [[ -n "$ROOT" ]] && hook_prefix="chroot /.host"
  write_if_changed "$LAB/bin/healthcheck" 755 <<EOF || true
#!/usr/bin/env bash
# Lab HealthCheckProgram: slurmd runs it with an empty environment except SLURMD_NODENAME.
export PATH=$SYS_PATH
export SLURM_CONF=$CONF
node=\${SLURMD_NODENAME:-unknown}
echo "\$(date +%s.%N) \$node" >>$LAB/log/healthcheck-calls.log
flag=$LAB/flags/\$node.bad
if [[ -f "\$flag" ]]; then
  text=\$(head -c 200 "\$flag" | tr -d '\n')
  scontrol update NodeName="\$node" State=DRAIN Reason="healthcheck: \${text:-flag file}" || true
fi
hook=$LAB/etc/healthcheck.hook
if [[ -x "\$hook" ]]; then
  echo "\$(date +%s.%N) \$node hook" >>$LAB/log/healthcheck-calls.log
  [[ -n "$ROOT" ]] && export PATH=$LAB/bin/wrap:\$PATH
  exec $hook_prefix /usr/bin/env PATH="\$PATH" SLURM_CONF="\$SLURM_CONF" SLURMD_NODENAME="\$node" "\$hook"
fi
exit 0
EOF
  write_if_changed "$LAB/bin/epilog" 755 <<EOF || true
#!/usr/bin/env bash
# Lab Epilog: runs $LAB/etc/epilog.hook when it is executable (tests use it to hold a job in COMPLETING).
export PATH=$SYS_PATH
export SLURM_CONF=$CONF
hook=$LAB/etc/epilog.hook
if [[ -x "\$hook" ]]; then
  echo "\$(date +%s.%N) \${SLURMD_NODENAME:-} job \${SLURM_JOB_ID:-}" >>$LAB/log/epilog-calls.log
  [[ -n "$ROOT" ]] && export PATH=$LAB/bin/wrap:\$PATH
  exec $hook_prefix /usr/bin/env PATH="\$PATH" SLURM_CONF="\$SLURM_CONF" "\$hook"
fi
exit 0
EOF
  # slurmd runs slurmstepd through this (slurmd -d): Slurm points slurmstepd's stderr at /dev/null, so a step
  # daemon that dies before it has read its log settings from slurmd (slurmd: "Can not read return code from
  # slurmstepd") says why nowhere. Its stderr and one line per start are kept in log/slurmstepd.log instead.
  write_if_changed "$LAB/bin/slurmstepd" 755 <<EOF || true
#!/bin/sh
fds=\$(for f in /proc/\$\$/fd/*; do printf '%s->%s ' "\${f##*/}" "\$(readlink "\$f")"; done)
echo "\$(date +%Y-%m-%dT%H:%M:%S.%N) pid \$\$ start \$* fds: \$fds" >>$LAB/log/slurmstepd.log
exec /usr/sbin/slurmstepd "\$@" 2>>$LAB/log/slurmstepd.log
EOF
  write_if_changed "$LAB/bin/fake-reboot" 755 <<EOF || true
#!/usr/bin/env bash
# Lab RebootProgram: slurmd runs it through system() holding its config lock, so it returns at once and a
# detached shell restarts that slurmd with -b ("node rebooted now").
export PATH=$SYS_PATH
export SLURM_CONF=$CONF
pid=\$\$ node="" sd=""
while [[ "\$pid" -gt 1 ]]; do
  comm=\$(cat /proc/\$pid/comm 2>/dev/null || true)
  if [[ "\$comm" == slurmd* ]]; then
    mapfile -d '' argv </proc/\$pid/cmdline
    for ((i = 0; i < \${#argv[@]}; i++)); do [[ "\${argv[i]}" == -N ]] && node=\${argv[i+1]}; done
    sd=\$pid
    break
  fi
  pid=\$(awk '{print \$4}' /proc/\$pid/stat 2>/dev/null || echo 0)
done
echo "\$(date +%s.%N) node=\$node slurmd=\$sd args=\$*" >>$LAB/log/reboot-calls.log
[[ -n "\$node" ]] || exit 1
setsid bash -c '
  echo \$\$ >"\$1/run/reboot-\$2.pid"
  sleep 1
  kill -TERM "\$3" 2>/dev/null
  # at most 20 s (monotonic clock), then SIGKILL: a slurmd that ignores SIGTERM must not hold the reboot forever
  end=\$(( \$(cut -d. -f1 /proc/uptime) + 20 ))
  while [ -d "/proc/\$3" ]; do
    if [ "\$(cut -d. -f1 /proc/uptime)" -ge "\$end" ]; then kill -KILL "\$3" 2>/dev/null; fi
    sleep 0.1
  done
  slurmd -f "\$1/etc/slurm.conf" -N "\$2" -b
  rm -f "\$1/run/reboot-\$2.pid"' fake-reboot "$LAB" "\$node" "\$sd" </dev/null >>$LAB/log/reboot-calls.log 2>&1 &
exit 0
EOF
  if [[ -n "$ROOT" ]]; then
    write_if_changed "$LAB/bin/chroot-exec" 755 <<EOF || true
#!/usr/bin/env bash
# Runs inside a fresh private mount namespace: mount what Slurm needs into the chroot, bind the lab dir at the
# same path, then exec the command there. 'daemon' also binds the host's root at /.host (for the health hook).
set -euo pipefail
# Always in a namespace of its own, however it is called: a run in the caller's namespace would leave its mounts
# there (seen: a lab dir or /etc/passwd bound over the chroot in the host's namespace, stale once the file or
# directory was replaced, and every later mount onto that path failing).
if [[ "\${GPUFLEET_LAB_NS:-}" != "\$\$" ]]; then
  export GPUFLEET_LAB_NS=\$\$
  exec unshare --mount --propagation private -- "\$0" "\$@"
fi
root=$ROOT
mode=\$1; shift
if [[ "$CHROOT_USERS" == host ]]; then
  # the host's users and groups, written in place (same inode): every namespace and running daemon sees them.
  # Overwritten without truncating first, then cut to length: a Slurm command reading the file meanwhile (another
  # lab command, a daemon) never finds it empty ("Invalid user for SlurmUser root", seen when a test added a user).
  for f in /etc/passwd /etc/group; do
    cmp -s "\$f" "\$root\$f" || { cat "\$f" 1<>"\$root\$f" && truncate -s "\$(stat -c %s "\$f")" "\$root\$f"; }
  done
fi
mount -t proc proc "\$root/proc"
mount --rbind /dev "\$root/dev"
# Host directories seen at the same path inside (job scripts, outputs, the checkout, .venv and its Python).
for d in $CHROOT_BINDS; do
  [[ -d "\$d" && "\$d" == /* && "\$d" != / ]] || continue
  mkdir -p "\$root\$d"
  mount --rbind "\$d" "\$root\$d"
done
mount --bind $LAB "\$root$LAB"
if [[ "\$mode" == daemon ]]; then
  mount --rbind /sys "\$root/sys"
  mount --rbind / "\$root/.host"
fi
exec chroot "\$root" /usr/bin/env PATH=$SYS_PATH /bin/sh -c 'cd "\$1" 2>/dev/null || cd /; shift; exec "\$@"' sh "\$PWD" "\$@"
EOF
    mkdir -p "$LAB/bin/wrap" "$ROOT$LAB" "$ROOT/.host"
    local c
    for c in scontrol sinfo squeue sbatch srun scancel sacct sacctmgr sprio sshare sdiag; do
      write_if_changed "$LAB/bin/wrap/$c" 755 <<EOF || true
#!/usr/bin/env bash
# Slurm $RELEASE client from the lab's chroot ($ROOT).
export SLURM_CONF=\${SLURM_CONF:-$CONF}
exec $LAB/bin/chroot-exec client /usr/bin/$c "\$@"
EOF
    done
  else
    rm -rf "$LAB/bin/wrap" "$LAB/bin/chroot-exec"
  fi
}

write_config() {
  local d n
  umask 022
  for d in etc state spool log run bin flags dev jobs munge; do mkdir -p "$LAB/$d"; chmod 755 "$LAB/$d"; done
  chmod 755 "$LAB"
  if [[ ! -s "$LAB/munge/munge.key" ]]; then
    head -c 1024 /dev/urandom >"$LAB/munge/munge.key"
  fi
  chown root:root "$LAB/munge/munge.key"; chmod 400 "$LAB/munge/munge.key"
  for ((n = 0; n < GPUS; n++)); do ln -sfn /dev/null "$LAB/dev/nvidia$n"; done
  for n in $(node_names); do mkdir -p "$LAB/spool/$n"; done
  write_programs
  if [[ -n "$JWKS" ]]; then
    [[ -f "$JWKS" ]] || die "SLURM_LAB_JWKS=$JWKS: no such file"
    write_if_changed "$LAB/etc/jwks.json" 644 <"$JWKS" || true
  fi
  if [[ -n "$EXTRA_CONF" && ! -f "$EXTRA_CONF" ]]; then die "SLURM_LAB_EXTRA_CONF=$EXTRA_CONF: no such file"; fi
  local gpu_files="$LAB/dev/nvidia0"
  ((GPUS > 1)) && gpu_files="$LAB/dev/nvidia[0-$((GPUS - 1))]"
  write_if_changed "$LAB/etc/gres.conf" 644 <<EOF || true
AutoDetect=off
NodeName=$(hostlist) Name=gpu Type=$GPU_TYPE File=$gpu_files
EOF
  local ports
  ports=$(slurmd_port "${PREFIX}1")
  ((NODES > 1)) && ports="[$(slurmd_port "${PREFIX}1")-$(slurmd_port "$PREFIX$NODES")]"
  {
    cat <<EOF
# Generated by slurm-lab.sh; rewritten on every start.
ClusterName=lab
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$LAB/munge/munge.socket.2
StateSaveLocation=$LAB/state
SlurmdSpoolDir=$LAB/spool/%n
SlurmctldPidFile=$LAB/run/slurmctld.pid
SlurmdPidFile=$LAB/run/slurmd-%n.pid
SlurmctldLogFile=$LAB/log/slurmctld.log
SlurmdLogFile=$LAB/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
$(accounting_conf)
JobCompType=jobcomp/filetxt
JobCompLoc=$LAB/log/jobcomp.log
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=1
SlurmdTimeout=$SLURMD_TIMEOUT
SlurmctldTimeout=30
MessageTimeout=10
InactiveLimit=0
KillWait=5
MinJobAge=300
RebootProgram=$REBOOT_PROGRAM
ResumeTimeout=180
EOF
    if ((HC_INTERVAL > 0)); then
      printf 'HealthCheckProgram=%s\nHealthCheckInterval=%s\nHealthCheckNodeState=ANY\n' "$HC_PROGRAM" "$HC_INTERVAL"
    fi
    if [[ "$EPILOG" != none ]] && ! { [[ -n "$EXTRA_CONF" ]] && grep -qi '^[[:space:]]*Epilog=' "$EXTRA_CONF"; }; then
      echo "Epilog=$EPILOG"
    fi
    if [[ -n "$JWKS" ]]; then
      printf 'AuthAltTypes=auth/jwt\nAuthAltParameters=jwks=%s\n' "$LAB/etc/jwks.json"
    fi
    echo "NodeName=$(hostlist) NodeHostname=localhost NodeAddr=127.0.0.1 Port=$ports CPUs=$CPUS Boards=1" \
      "SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM_MB Gres=gpu:$GPU_TYPE:$GPUS State=UNKNOWN"
    echo "PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    if [[ -n "$EXTRA_CONF" ]]; then echo "# --- $EXTRA_CONF"; cat "$EXTRA_CONF"; fi
  } >"$CONF.new"
  CONF_CHANGED=0
  write_if_changed "$CONF" 644 <"$CONF.new" && CONF_CHANGED=1
  rm -f "$CONF.new"
  return 0
}

# --- daemons -----------------------------------------------------------------------------------------------
munged_pid() { verified_pid "$LAB/run/munged.pid" /usr/sbin/munged; }
ctld_pid() { verified_pid "$LAB/run/slurmctld.pid" /usr/sbin/slurmctld; }
slurmd_pid() { verified_pid "$LAB/run/slurmd-$1.pid" /usr/sbin/slurmd; }
restd_pid() { verified_pid "$LAB/run/slurmrestd.pid" /usr/sbin/slurmrestd; }
reboot_pid() { verified_pid "$LAB/run/reboot-$1.pid" /usr/bin/bash; }

# lab_munged: the PID of a live munged of this lab that runs this release's binary, found without its PID file;
# nothing when there is none.
lab_munged() {
  local p cmd exe
  for p in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline") || continue
    lab_munged_cmd "$cmd" || continue
    exe=$(readlink "$p/exe" 2>/dev/null || true)
    [[ "${exe% (deleted)}" == "$(binary_path /usr/sbin/munged)" ]] || continue
    echo "${p#/proc/}"
    return 0
  done
  return 1
}

start_munged() {
  munged_pid >/dev/null && return 0
  # A munged of this lab that its PID file does not name (a PID file written by a process of munged's start that
  # then exited, seen once under load): it holds the socket's lock, so a second one could never start. Adopt it.
  local live
  if live=$(lab_munged); then
    adopt_munged "$live"
    munged_pid >/dev/null && return 0
  fi
  daemon /usr/sbin/munged --key-file="$LAB/munge/munge.key" --socket="$LAB/munge/munge.socket.2" \
    --pid-file="$LAB/run/munged.pid" --log-file="$LAB/log/munged.log" --seed-file="$LAB/munge/munge.seed" \
    || die "munged failed to start; see $LAB/log/munged.log"
  local end
  end=$(deadline 10)
  until munged_pid >/dev/null; do
    if past "$end"; then
      tail -5 "$LAB/log/munged.log" >&2 || true
      die "munged did not write a valid PID file within 10 s; see $LAB/log/munged.log"
    fi
    sleep 0.1
  done
}

# MariaDB is the host's for either release: found by its PID file, its binary and its command line (it names this
# lab's data directory); never any process that merely names the lab.
mariadb_pid() { verified_pid "$LAB/run/mariadb.pid" host:/usr/sbin/mariadbd; }
dbd_pid() { verified_pid "$LAB/run/slurmdbd.pid" /usr/sbin/slurmdbd; }
db_client() { mariadb --no-defaults --socket="$LAB/run/mariadb.sock" -u root "$@"; }

start_mariadb() {
  mariadb_pid >/dev/null && return 0
  port_busy "$DB_PORT" && die "port $DB_PORT (MariaDB) is busy: choose another SLURM_LAB_PORT_BASE"
  # the database is the release's (slurmdbd 24.11 refuses a 22.05 schema as "too old to upgrade"): a data
  # directory made for another release, or without its mark, is made again
  if [[ -d "$DB_DIR" && "$(cat "$DB_DIR/.gpufleet-release" 2>/dev/null)" != "$RELEASE" ]]; then
    log "the accounting database in $DB_DIR is not Slurm $RELEASE's: making a new one"
    rm -rf "$DB_DIR"
  fi
  if [[ ! -d "$DB_DIR/mysql" ]]; then  # a data directory of its own, made once (whole, or not at all)
    rm -rf "$DB_DIR.new"; mkdir -p "$DB_DIR.new" "$LAB/tmp-db"
    # a temporary directory of the lab's own: two installs sharing /tmp collide on their temporary tables' names
    mariadb-install-db --no-defaults --datadir="$DB_DIR.new" --tmpdir="$LAB/tmp-db" --user=root \
      --auth-root-authentication-method=socket --skip-test-db >"$LAB/log/mariadb-install.log" 2>&1 ||
      { tail -20 "$LAB/log/mariadb-install.log" >&2; die "mariadb-install-db failed; see $LAB/log/mariadb-install.log"; }
    echo "$RELEASE" >"$DB_DIR.new/.gpufleet-release"
    mv "$DB_DIR.new" "$DB_DIR"
  fi
  mkdir -p "$LAB/tmp-db"
  setsid /usr/sbin/mariadbd --no-defaults --datadir="$DB_DIR" --tmpdir="$LAB/tmp-db" --socket="$LAB/run/mariadb.sock" \
    --port="$DB_PORT" --bind-address=127.0.0.1 --pid-file="$LAB/run/mariadb.pid" --log-error="$LAB/log/mariadb.log" \
    --user=root --skip-name-resolve --innodb-buffer-pool-size=32M </dev/null >>"$LAB/log/mariadb.log" 2>&1 &
  local end
  end=$(deadline 60)
  until mariadb_pid >/dev/null && db_client -e 'SELECT 1' >/dev/null 2>&1; do
    if past "$end"; then
      tail -20 "$LAB/log/mariadb.log" >&2 || true
      die "MariaDB did not answer on $LAB/run/mariadb.sock within 60 s; see $LAB/log/mariadb.log"
    fi
    sleep 0.2
  done
  # slurmdbd's own user, loopback only (the lab's database holds nothing but this lab's records)
  db_client -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmlab';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;" || die "MariaDB: cannot create slurmdbd's user"
}

start_slurmdbd() {
  dbd_pid >/dev/null && return 0
  port_busy "$DBD_PORT" && die "port $DBD_PORT (slurmdbd) is busy: choose another SLURM_LAB_PORT_BASE"
  # slurmdbd reads slurmdbd.conf beside SLURM_CONF; it must be the SlurmUser's and not readable by others
  write_if_changed "$LAB/etc/slurmdbd.conf" 600 <<EOF || true
# Generated by slurm-lab.sh; rewritten on every start.
AuthType=auth/munge
AuthInfo=socket=$LAB/munge/munge.socket.2
DbdAddr=127.0.0.1
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$LAB/run/slurmdbd.pid
LogFile=$LAB/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurmlab
StorageLoc=slurm_acct_db
EOF
  daemon /usr/sbin/slurmdbd || die "slurmdbd failed to start; see $LAB/log/slurmdbd.log"
  local end out=""
  end=$(deadline 60)
  until dbd_pid >/dev/null && out=$(client_t 10 sacctmgr -n -P list cluster format=cluster 2>&1); do
    if past "$end"; then
      echo "--- last 'sacctmgr list cluster': $out" >&2; tail -20 "$LAB/log/slurmdbd.log" >&2 || true
      die "slurmdbd did not answer within 60 s; see $LAB/log/slurmdbd.log"
    fi
    sleep 0.2
  done
  grep -qx lab <<<"$out" || client_t 30 sacctmgr -i add cluster lab >/dev/null || die "sacctmgr add cluster lab failed"
}

start_slurmctld() {
  local fresh=$1 t0 end out="" rc=0
  if ctld_pid >/dev/null; then return 0; fi
  port_busy "$CTLD_PORT" && die "port $CTLD_PORT (slurmctld) is busy: choose another SLURM_LAB_PORT_BASE"
  local -a args=(-f "$CONF")
  if ((fresh)); then args+=(-c); fi
  daemon /usr/sbin/slurmctld "${args[@]}" || die "slurmctld failed to start; see $LAB/log/slurmctld.log"
  t0=$(now_ms); end=$(deadline "$CTLD_TIMEOUT")
  while :; do
    if ctld_pid >/dev/null; then
      rc=0; out=$(client_t 10 scontrol ping 2>&1) || rc=$?
      if grep -q 'is UP' <<<"$out"; then
        log "slurmctld answered after $(($(now_ms) - t0)) ms"
        return 0
      fi
    else
      out="(no slurmctld process with a valid PID file)"; rc=-1
    fi
    past "$end" && break
    sleep 0.2
  done
  echo "--- last 'scontrol ping' (rc $rc): $out" >&2
  echo "--- $LAB/log/slurmctld.log (tail)" >&2; tail -20 "$LAB/log/slurmctld.log" >&2 || true
  echo "--- $LAB/log/munged.log (tail)" >&2; tail -5 "$LAB/log/munged.log" >&2 || true
  die "slurmctld did not answer 'scontrol ping' within ${CTLD_TIMEOUT} s ($(($(now_ms) - t0)) ms waited)"
}

start_slurmd() {
  local node=$1 port
  slurmd_pid "$node" >/dev/null && return 0
  reboot_pid "$node" >/dev/null && return 0
  port=$(slurmd_port "$node")
  port_busy "$port" && die "port $port (slurmd $node) is busy: choose another SLURM_LAB_PORT_BASE"
  mkdir -p "$LAB/spool/$node"
  daemon /usr/sbin/slurmd -f "$CONF" -N "$node" -d "$LAB/bin/slurmstepd" ||
    die "slurmd $node failed to start; see $LAB/log/slurmd-$node.log"
}

start_slurmrestd() {
  [[ -n "$JWKS" ]] || return 0
  restd_pid >/dev/null && return 0
  port_busy "$RESTD_PORT" && die "port $RESTD_PORT (slurmrestd) is busy"
  local plugin=openapi/v0.0.38
  [[ "$RELEASE" == 24.11 ]] && plugin=openapi/slurmctld
  # shellcheck disable=SC2016  # expanded by the inner shell
  SLURM_JWT=daemon daemon setsid bash -c 'echo $$ >"$1"; exec /usr/sbin/slurmrestd -f "$2" -u nobody -g nogroup \
    -a rest_auth/jwt -s "$3" "127.0.0.1:$4"' restd "$LAB/run/slurmrestd.pid" "$CONF" "$plugin" "$RESTD_PORT" \
    </dev/null >>"$LAB/log/slurmrestd.log" 2>&1 &
  local end
  end=$(deadline 15)
  until restd_pid >/dev/null && port_busy "$RESTD_PORT"; do
    if past "$end"; then
      tail -20 "$LAB/log/slurmrestd.log" >&2 || true
      die "slurmrestd did not listen on port $RESTD_PORT within 15 s"
    fi
    sleep 0.1
  done
}

# node_states: "name state" lines from sinfo (one partition, so one line per node).
node_states() { client_t 10 sinfo -h -N -o '%N %T' 2>/dev/null | sort -u; }

# wait_nodes MODE: idle = every node idle; responding = registered and answering (no unk, no '*').
wait_nodes() {
  local mode=$1 start end states bad n s
  start=$(now_ms); end=$(deadline "$TIMEOUT")
  while :; do
    states=$(node_states || true)
    bad=0
    if [[ $(wc -l <<<"$states") -lt $NODES || -z "$states" ]]; then bad=1; fi
    while read -r n s; do
      [[ -z "$n" ]] && continue
      case "$s" in
        inval*) die "node $n is INVAL; see $LAB/log/slurmd-$n.log and 'scontrol show node $n'" ;;
      esac
      if [[ "$mode" == idle ]]; then
        [[ "$s" == idle ]] || bad=1
      else
        [[ "$s" == unk* || "$s" == *'*' || "$s" == *not_responding* ]] && bad=1
      fi
    done <<<"$states"
    ((bad)) || break
    if past "$end"; then
      echo "$states" >&2
      die "nodes not $mode after ${TIMEOUT}s"
    fi
    sleep 0.2
  done
  log "all $NODES nodes $mode after $(($(now_ms) - start)) ms"
}

# token_alive TOKEN: whether the test process a "test:PID:START:RANDOM" token names still runs (its PID with that
# start time, field 22 of /proc/PID/stat); any other token (a person's) is not a process: not alive here.
token_alive() {
  local pid start stat
  IFS=: read -r _ pid start _ <<<"$1"
  [[ "$1" == test:* && "$pid" =~ ^[0-9]+$ ]] || return 1
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  read -r -a stat <<<"$stat"
  [[ "${stat[19]}" == "$start" ]]
}

# check_owner RUNNING: a running lab is attached to only by its owner (SLURM_LAB_OWNER); anyone else is refused by
# name. A lab that is not running is refused too while its owner file names a test process that still lives (a
# stop removes the file): that process's lab is stopped for the moment (a test that stops slurmctld on purpose), and
# its directory is not another lab's to take.
check_owner() {
  local running=$1 holder="" note=""
  if [[ -f "$LAB/owner" ]]; then { IFS= read -r holder; IFS= read -r note; } <"$LAB/owner" || true; fi
  [[ "$holder" == "$OWNER" ]] && return 0
  if ((!running)); then
    token_alive "$holder" || return 0
    die "the lab directory $LAB belongs to a test process that still runs: '$holder'${note:+ ($note)}, not" \
      "'$OWNER'; its lab is stopped only for the moment: choose another SLURM_LAB_PORT_BASE and SLURM_LAB_DIR"
  fi
  [[ -n "$holder" ]] || holder="nobody on record (a lab from an older slurm-lab.sh)"
  die "the lab in $LAB is running and held by '$holder'${note:+ ($note)}, not by '$OWNER': leave it alone, stop it" \
    "as its owner (slurm-lab.sh stop with its SLURM_LAB_DIR), or choose another SLURM_LAB_PORT_BASE and SLURM_LAB_DIR"
}

cmd_start() {
  local t0 fresh=0 was_running=0
  t0=$(now_ms)
  [[ $EUID -eq 0 ]] || die "must run as root"
  if [[ -n "$ROOT" ]]; then build_chroot; else install_host_packages; fi
  if ((ACCOUNTING)); then install_accounting_packages; fi
  if [[ -f "$LAB/etc/release" && "$(cat "$LAB/etc/release")" != "$RELEASE" ]] && port_busy "$CTLD_PORT"; then
    die "the lab in $LAB runs Slurm $(cat "$LAB/etc/release"); stop it first (slurm-lab.sh stop)"
  fi
  ctld_pid >/dev/null && was_running=1
  check_owner "$was_running"
  ((was_running)) || stop_strays
  if [[ -f "$LAB/etc/release" && "$(cat "$LAB/etc/release")" != "$RELEASE" ]]; then
    log "switching $LAB from Slurm $(cat "$LAB/etc/release") to $RELEASE: clearing saved state, spool and accounting"
    # the accounting database is the release's too: slurmdbd 24.11 refuses a 22.05 schema ("too old to upgrade")
    rm -rf "${LAB:?}/state" "${LAB:?}/spool" "$DB_DIR"
  fi
  write_config
  echo "$RELEASE" >"$LAB/etc/release"
  printf '%s\n%s\n' "$OWNER" "$OWNER_NOTE" >"$LAB/owner.new" && mv -f "$LAB/owner.new" "$LAB/owner"
  start_munged
  if ((ACCOUNTING)); then start_mariadb; start_slurmdbd; fi
  if ((!was_running)) && [[ "$KEEP_STATE" != 1 ]]; then fresh=1; fi
  # A fresh lab starts clean: no health flag and no hook left by a run that was killed before its teardown
  # (a leftover healthcheck.hook drains its node at the first health check, and "nodes not idle" follows).
  if ((fresh)); then rm -f "$LAB"/flags/*.bad "$LAB/etc/healthcheck.hook" "$LAB/etc/epilog.hook"; fi
  # A fresh slurmctld (-c) still reads its ClusterID from state/clustername, and refuses to start ("CLUSTER ID
  # MISMATCH") when slurmdbd knows the cluster by another: an accounting lab, then a lab without accounting (a new
  # ClusterID), then an accounting lab again in this directory. A fresh lab takes the ID slurmdbd has (or a new one).
  if ((fresh)); then rm -f "$LAB/state/clustername"; fi
  start_slurmctld "$fresh"
  if ((was_running && CONF_CHANGED)); then log "slurm.conf changed: scontrol reconfigure"; client scontrol reconfigure; fi
  local n
  for n in $(node_names); do start_slurmd "$n"; done
  start_slurmrestd
  if ((fresh)); then wait_nodes idle; else wait_nodes responding; fi
  log "started in $(($(now_ms) - t0)) ms ($(client scontrol --version), lab $LAB)"
  cmd_env
}

cmd_stop() {
  local t0 jobs end n
  t0=$(now_ms)
  if ctld_pid >/dev/null; then
    jobs=$(client_t 10 squeue -h -o '%A' 2>/dev/null || true)
    if [[ -n "$jobs" ]]; then
      log "cancelling jobs: $(tr '\n' ' ' <<<"$jobs")"
      # shellcheck disable=SC2086
      client_t 10 scancel $jobs 2>/dev/null || true
      end=$(deadline 10)
      until [[ -z "$(client_t 10 squeue -h -o '%A' 2>/dev/null || true)" ]] || past "$end"; do sleep 0.1; done
    fi
  fi
  local -a specs=()
  for n in $(node_names); do specs+=("fake-reboot $n:$LAB/run/reboot-$n.pid:/usr/bin/bash"); done
  stop_pids "${specs[@]}"
  specs=("slurmrestd:$LAB/run/slurmrestd.pid:/usr/sbin/slurmrestd")
  # Also nodes of an earlier, larger lab in the same directory.
  local f
  for f in "$LAB"/run/slurmd-*.pid; do
    [[ -e "$f" ]] || continue
    n=${f##*/slurmd-}; n=${n%.pid}
    specs+=("slurmd $n:$f:/usr/sbin/slurmd")
  done
  stop_pids "${specs[@]}"
  stop_pids "slurmctld:$LAB/run/slurmctld.pid:/usr/sbin/slurmctld"
  # accounting, whether or not this call asked for it: a lab started with it keeps its PID files
  stop_pids "slurmdbd:$LAB/run/slurmdbd.pid:/usr/sbin/slurmdbd"
  stop_pids "mariadb:$LAB/run/mariadb.pid:host:/usr/sbin/mariadbd"
  stop_strays
  stop_pids "munged:$LAB/run/munged.pid:/usr/sbin/munged"
  rm -f "$LAB/owner"  # nothing of the lab runs: its directory is free for the next holder of the block
  log "stopped in $(($(now_ms) - t0)) ms"
}

updown() { if "$@" >/dev/null; then echo running; else echo stopped; fi; }
cmd_status() {
  local n rc=0
  printf '%-12s %s\n' munged "$(updown munged_pid)" slurmctld "$(updown ctld_pid)"
  for n in $(node_names); do printf '%-12s %s\n' "slurmd $n" "$(updown slurmd_pid "$n")"; done
  if [[ -n "$JWKS" ]]; then printf '%-12s %s\n' slurmrestd "$(updown restd_pid)"; fi
  if ((ACCOUNTING)) || [[ -f "$LAB/run/slurmdbd.pid" ]]; then
    printf '%-12s %s\n' slurmdbd "$(updown dbd_pid)" mariadb "$(updown mariadb_pid)"
  fi
  if ctld_pid >/dev/null; then client sinfo -N -o '%N %T %G %E' || true; else rc=1; fi
  return "$rc"
}

cmd_env() {
  echo "export SLURM_CONF=$CONF"
  [[ -n "$ROOT" ]] && echo "export PATH=$LAB/bin/wrap:\$PATH"
  return 0
}

cmd_wait() { ctld_pid >/dev/null || die "slurmctld is not running (slurm-lab.sh start)"; wait_nodes responding; }

cmd_clean() {
  cmd_stop
  local real
  real=$(readlink -m "$LAB")
  case "$real" in
    "" | / | /var | /tmp | /usr | /etc | /root | /home) die "refusing to delete '$real'" ;;
  esac
  [[ "$real" == "$(readlink -m "${TMPDIR:-/tmp}")" ]] && die "refusing to delete the temp directory"
  rm -rf "$real"
  log "removed $real"
}

# --- selftest ----------------------------------------------------------------------------------------------
state_of() { client_t 10 sinfo -h -N -n "$1" -o '%T' | head -1; }
poll_state() { # poll_state NODE WANT SECONDS
  local node=$1 want=$2 limit=$3 t0 s
  t0=$(now_ms)
  while :; do
    s=$(state_of "$node")
    [[ "$s" == "$want" ]] && { echo "$(($(now_ms) - t0))"; return 0; }
    (($(now_ms) - t0 >= limit * 1000)) && die "selftest: $node is '$s', expected '$want' within ${limit}s"
    sleep 0.1
  done
}
step() { printf 'selftest: %-40s %6s ms\n' "$1" "$2"; }

cmd_selftest() {
  ((NODES >= 3)) || die "selftest needs at least 3 nodes"
  ctld_pid >/dev/null || die "slurmctld is not running (slurm-lab.sh start)"
  wait_nodes idle
  local t0 ms job n2="${PREFIX}2" n3="${PREFIX}3" end
  t0=$(now_ms)
  client scontrol update NodeName="$n2" State=DRAIN Reason="xid 79 (selftest)"
  [[ "$(state_of "$n2")" == drained ]] || die "selftest: $n2 not drained"
  client sinfo -R -h -o '%N|%E' | grep -Fxq "$n2|xid 79 (selftest)" || die "selftest: reason missing in sinfo -R"
  client scontrol update NodeName="$n2" State=RESUME
  poll_state "$n2" idle 10 >/dev/null
  step "drain + resume $n2" "$(($(now_ms) - t0))"

  t0=$(now_ms)
  local out
  # shellcheck disable=SC2016  # expanded in the job
  out=$(client srun -N "$NODES" -n "$NODES" --gres=gpu:1 bash -c 'echo $SLURMD_NODENAME' | sort | tr '\n' ' ')
  [[ "$out" == "$(node_names | sort | tr '\n' ' ')" ]] || die "selftest: srun ran on '$out'"
  step "srun on all $NODES nodes" "$(($(now_ms) - t0))"

  t0=$(now_ms)
  job=$(client sbatch --parsable -w "$n3" -o /dev/null --wrap 'sleep 30')
  end=$(deadline 10)
  until [[ "$(client_t 10 squeue -h -j "$job" -o '%T')" == RUNNING ]] || past "$end"; do sleep 0.1; done
  [[ "$(client squeue -h -j "$job" -o '%T')" == RUNNING ]] || die "selftest: job $job not running"
  client scontrol update NodeName="$n3" State=DRAIN Reason="selftest draining"
  [[ "$(state_of "$n3")" == draining ]] || die "selftest: $n3 not draining"
  client scontrol requeue "$job"
  client scancel "$job"
  poll_state "$n3" drained 20 >/dev/null
  client scontrol update NodeName="$n3" State=RESUME
  poll_state "$n3" idle 10 >/dev/null
  step "job + drng + requeue on $n3" "$(($(now_ms) - t0))"

  t0=$(now_ms)
  client scontrol reboot ASAP nextstate=RESUME reason="selftest reboot" "$n3"
  ms=$(poll_state "$n3" idle 30)
  step "reboot ASAP $n3" "$ms"

  if ((HC_INTERVAL > 0)) && [[ "$HC_PROGRAM" == "$LAB/bin/healthcheck" ]]; then
    t0=$(now_ms)
    echo "xid 79 (selftest flag)" >"$LAB/flags/$n2.bad"
    poll_state "$n2" drained $((3 * HC_INTERVAL + 2)) >/dev/null
    rm -f "$LAB/flags/$n2.bad"
    client scontrol update NodeName="$n2" State=RESUME
    poll_state "$n2" idle 10 >/dev/null
    step "health flag -> drained -> resumed $n2" "$(($(now_ms) - t0))"
  fi
  wait_nodes idle
  echo "selftest: OK"
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  restart) env -u SLURM_LAB_RELEASE bash "$0" stop; cmd_start ;;
  status) cmd_status ;;
  env) cmd_env ;;
  wait) cmd_wait ;;
  selftest) cmd_selftest ;;
  clean) cmd_clean ;;
  *) echo "usage: $0 start|stop|restart|status|env|wait|selftest|clean" >&2; exit 2 ;;
esac
