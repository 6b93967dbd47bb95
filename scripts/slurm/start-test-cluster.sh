#!/usr/bin/env bash
# recovery-logs copy of ../shared/slurm/start-test-cluster.sh (adds params.env: restarts reuse
# the ports and names the state dir was created with).
#
# Start a throw-away single-host Slurm 22.05 cluster (Debian 12 packages) with several
# logical GPU nodes, slurmdbd accounting and a private munged + mariadbd.
#
# Usage:  start-test-cluster.sh [--fresh] [STATE_DIR]
#   STATE_DIR  where configs, keys, databases, logs and pid files go
#              (default: $SLURM_TEST_STATE, else ./slurm-test-state). Keep its path
#              short (under ~60 chars): unix socket paths are limited to 107 bytes.
#   --fresh    stop anything running from STATE_DIR and wipe it first.
#
# Tunables (environment):
#   SLURM_TEST_NODES=4            number of logical nodes (<prefix>01..NN)
#   SLURM_TEST_NODE_PREFIX=gpu-n  node name prefix
#   SLURM_TEST_GPUS_PER_NODE=8    fake GPUs per node
#   SLURM_TEST_GPU_TYPE=h100      GPU type (Gres=gpu:<type>:<n>)
#   SLURM_TEST_CLUSTER=testcluster
#   SLURM_TEST_PORT_BASE=16800    mysql=+6 slurmctld=+17 slurmdbd=+19 slurmd=+101..
#   SLURM_TEST_SLURMD_TIMEOUT=20  seconds before a silent slurmd's node goes DOWN
#   SLURM_TEST_WAIT=120           seconds to wait for each daemon / for idle nodes
#   SLURM_TEST_NO_INSTALL=1       never call apt-get (fail if packages are missing)
#
# Needs root. Touches nothing outside STATE_DIR except installing Debian packages
# (slurm-wlm slurmdbd munge mariadb-server) when they are missing.
# Idempotent: daemons already running from STATE_DIR are left alone.
set -euo pipefail

exec 3>&2   # log to the original stderr even inside redirected checks
log() { printf '[start-test-cluster] %s\n' "$*" >&3; }
die() { log "ERROR: $*"; exit 1; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FRESH=0
STATE_ARG=""
for a in "$@"; do
  case "$a" in
    --fresh) FRESH=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $a" ;;
    *) STATE_ARG=$a ;;
  esac
done
STATE_ARG=${STATE_ARG:-${SLURM_TEST_STATE:-./slurm-test-state}}

# recovery-logs: a restart without --fresh reuses the tunables the state dir was created
# with (params.env), so that restarting one daemon never re-renders the configs with other
# ports. Explicit environment variables still win.
if [ "$FRESH" = 0 ] && [ -f "$STATE_ARG/params.env" ]; then
  while IFS='=' read -r k v; do
    case "$k" in SLURM_TEST_*) [ -n "${!k:-}" ] || export "$k=$v" ;; esac
  done < "$STATE_ARG/params.env"
fi

NODES=${SLURM_TEST_NODES:-4}
PREFIX=${SLURM_TEST_NODE_PREFIX:-gpu-n}
GPUS=${SLURM_TEST_GPUS_PER_NODE:-8}
GPU_TYPE=${SLURM_TEST_GPU_TYPE:-h100}
CLUSTER=${SLURM_TEST_CLUSTER:-testcluster}
PORT_BASE=${SLURM_TEST_PORT_BASE:-16800}
SLURMD_TIMEOUT=${SLURM_TEST_SLURMD_TIMEOUT:-20}
WAIT=${SLURM_TEST_WAIT:-120}

[ "$(id -u)" = 0 ] || die "must run as root"
[[ $NODES =~ ^[0-9]+$ ]] && [ "$NODES" -ge 1 ] && [ "$NODES" -le 99 ] || die "SLURM_TEST_NODES must be 1..99"
[[ $GPUS =~ ^[0-9]+$ ]] && [ "$GPUS" -ge 1 ] || die "SLURM_TEST_GPUS_PER_NODE must be >= 1"

MYSQL_PORT=$((PORT_BASE + 6))
CTLD_PORT=$((PORT_BASE + 17))
DBD_PORT=$((PORT_BASE + 19))
SLURMD_PORT_FIRST=$((PORT_BASE + 101))
SLURMD_PORT_LAST=$((PORT_BASE + 100 + NODES))
NODELIST=$(printf '%s[01-%02d]' "$PREFIX" "$NODES")
NODE_NAMES=()
for i in $(seq 1 "$NODES"); do NODE_NAMES+=("$(printf '%s%02d' "$PREFIX" "$i")"); done
HOST=$(uname -n); HOST=${HOST%%.*}

# ---------------------------------------------------------------- packages
need_pkgs() {
  local b
  for b in slurmctld slurmd slurmdbd sacct sacctmgr scontrol sinfo squeue sbatch munged mungekey mariadbd mariadb-install-db mariadb mariadb-admin; do
    command -v "$b" >/dev/null 2>&1 || return 0
  done
  [ -e /usr/lib/x86_64-linux-gnu/slurm-wlm/accounting_storage_mysql.so ] || ls /usr/lib/*/slurm-wlm/accounting_storage_mysql.so >/dev/null 2>&1 || return 0
  return 1
}
PATH=$PATH:/usr/sbin:/sbin
if need_pkgs; then
  [ "${SLURM_TEST_NO_INSTALL:-0}" = 1 ] && die "Slurm/munge/mariadb packages missing and SLURM_TEST_NO_INSTALL=1"
  log "installing Debian packages (slurm-wlm slurmdbd munge mariadb-server)"
  t=$SECONDS
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurm-wlm slurmdbd munge mariadb-server >/dev/null
  log "packages installed in $((SECONDS - t)) s"
fi

# ---------------------------------------------------------------- state dir
mkdir -p "$STATE_ARG"
STATE=$(cd "$STATE_ARG" && pwd)
[ "${#STATE}" -le 60 ] || log "WARNING: state dir path is ${#STATE} chars; unix socket paths may exceed 107 bytes"

if [ "$FRESH" = 1 ]; then
  # only ever wipe an empty dir or one that this script set up
  if [ -n "$(ls -A "$STATE")" ] && [ ! -f "$STATE/etc/slurm.conf" ]; then
    die "--fresh: $STATE is not empty and has no etc/slurm.conf; refusing to wipe it"
  fi
  if [ -d "$STATE/run" ] && [ -x "$HERE/stop-test-cluster.sh" ]; then
    "$HERE/stop-test-cluster.sh" "$STATE" >&2 || true
  fi
  log "wiping $STATE"
  find "$STATE" -mindepth 1 -delete
fi

mkdir -p "$STATE"/{etc,run,log,ctld,mysql,dev,munge}
for n in "${NODE_NAMES[@]}"; do mkdir -p "$STATE/spool/$n"; done
# munged insists: socket dir world-searchable, key dir private.
chmod 755 "$STATE" "$STATE/run"
chmod 700 "$STATE/munge"
export SLURM_CONF="$STATE/etc/slurm.conf"

# ---------------------------------------------------------------- configs
render() { # template -> destination
  sed -e "s|@STATE@|$STATE|g" -e "s|@CLUSTER@|$CLUSTER|g" -e "s|@CTLD_HOST@|$HOST|g" \
      -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@DBD_PORT@|$DBD_PORT|g" -e "s|@MYSQL_PORT@|$MYSQL_PORT|g" \
      -e "s|@SLURMD_PORT_FIRST@|$SLURMD_PORT_FIRST|g" \
      -e "s|@SLURMD_PORTS@|[$SLURMD_PORT_FIRST-$SLURMD_PORT_LAST]|g" \
      -e "s|@NODELIST@|$NODELIST|g" -e "s|@GPU_TYPE@|$GPU_TYPE|g" -e "s|@GPUS_PER_NODE@|$GPUS|g" \
      -e "s|@GPU_LAST@|$((GPUS - 1))|g" -e "s|@SLURMD_TIMEOUT@|$SLURMD_TIMEOUT|g" \
      "$1" > "$2.tmp"
  if grep -q '@[A-Z_]*@' "$2.tmp"; then die "unrendered placeholder in $2"; fi
  if cmp -s "$2.tmp" "$2"; then rm -f "$2.tmp"; else mv "$2.tmp" "$2"; CONFIG_CHANGED=1; fi
}
CONFIG_CHANGED=0
for f in slurm.conf slurmdbd.conf gres.conf cgroup.conf; do
  [ -f "$HERE/$f" ] || die "template $HERE/$f missing"
  render "$HERE/$f" "$STATE/etc/$f"
done
chmod 600 "$STATE/etc/slurmdbd.conf"
if [ "$CONFIG_CHANGED" = 1 ] && [ -s "$STATE/run/slurmctld.pid" ]; then
  log "WARNING: configs changed while daemons may be running; stop and start again to apply them"
fi
chmod 644 "$STATE/etc/slurm.conf" "$STATE/etc/gres.conf" "$STATE/etc/cgroup.conf"

# fake GPU device files (char devices if mknod is allowed, else plain files)
for i in $(seq 0 $((GPUS - 1))); do
  d="$STATE/dev/nvidia$i"
  [ -e "$d" ] || mknod "$d" c 195 "$i" 2>/dev/null || : > "$d"
done

cat > "$STATE/params.env" <<EOF
SLURM_TEST_NODES=$NODES
SLURM_TEST_NODE_PREFIX=$PREFIX
SLURM_TEST_GPUS_PER_NODE=$GPUS
SLURM_TEST_GPU_TYPE=$GPU_TYPE
SLURM_TEST_CLUSTER=$CLUSTER
SLURM_TEST_PORT_BASE=$PORT_BASE
SLURM_TEST_SLURMD_TIMEOUT=$SLURMD_TIMEOUT
EOF

cat > "$STATE/env.sh" <<EOF
# source this file to talk to the test cluster
export SLURM_CONF="$STATE/etc/slurm.conf"
EOF

# ---------------------------------------------------------------- helpers
pid_alive() { # pidfile expected-name
  local p
  [ -s "$1" ] || return 1
  p=$(cat "$1" 2>/dev/null) || return 1
  [[ $p =~ ^[0-9]+$ ]] || return 1
  [ -r "/proc/$p/cmdline" ] || return 1
  tr '\0' ' ' < "/proc/$p/cmdline" | grep -q -- "$2"
}
wait_for() { # [--pid PIDFILE NAME LOG] description command...
  local pidf="" pname="" plog="" what t0=$SECONDS
  if [ "$1" = --pid ]; then pidf=$2 pname=$3 plog=$4; shift 4; fi
  what=$1; shift
  until "$@" >/dev/null 2>&1; do
    if [ $((SECONDS - t0)) -ge "$WAIT" ]; then die "timed out after ${WAIT}s waiting for $what (logs in $STATE/log)"; fi
    # a daemon that died after forking (e.g. port taken) fails fast instead of timing out
    if [ -n "$pidf" ] && [ -s "$pidf" ] && ! pid_alive "$pidf" "$pname"; then
      die "$what: daemon exited; last log lines:"$'\n'"$(tail -n 8 "$plog" 2>/dev/null)"
    fi
    sleep 0.2
  done
}
close_fds() { # close every fd above 2 in the current (sub)shell
  local fd
  for fd in /proc/self/fd/*; do
    fd=${fd##*/}
    if [ "$fd" -gt 2 ] 2>/dev/null; then eval "exec $fd>&-" 2>/dev/null || true; fi
  done
}
spawn() { # [--bg] LOGFILE CMD...: run a daemon with stdin=/dev/null, stdout/stderr=LOGFILE and
  # every other inherited fd closed, so it never holds the caller's pipes open
  # (otherwise `start-test-cluster.sh | tee` or subprocess.run(capture_output=True) hang).
  # --bg: for programs that do not daemonize themselves: background, own session.
  local bg=0 out
  if [ "$1" = --bg ]; then bg=1; shift; fi
  out=$1; shift
  if [ "$bg" = 1 ]; then
    ( close_fds; exec setsid "$@" ) </dev/null >>"$out" 2>&1 &
  else
    ( close_fds; exec "$@" ) </dev/null >>"$out" 2>&1
  fi
}
port_open() { (exec 9<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
need_port() { # port label: fail fast if something else already listens there
  if port_open "$1"; then die "port $1 ($2) is already in use: another cluster? set SLURM_TEST_PORT_BASE"; fi
}
STARTED=0
T0=$(date +%s.%N)
on_exit() { local rc=$?; [ "$rc" -eq 0 ] || log "start failed; clean up with: $HERE/stop-test-cluster.sh $STATE"; }
trap on_exit EXIT

# fail before starting anything if a port we need is taken by someone else
pid_alive "$STATE/run/mysqld.pid" mariadbd || need_port "$MYSQL_PORT" mariadbd
pid_alive "$STATE/run/slurmdbd.pid" slurmdbd || need_port "$DBD_PORT" slurmdbd
pid_alive "$STATE/run/slurmctld.pid" slurmctld || need_port "$CTLD_PORT" slurmctld
for i in $(seq 1 "$NODES"); do
  n=${NODE_NAMES[$((i - 1))]}
  pid_alive "$STATE/run/slurmd-$n.pid" "slurmd -N $n" || need_port $((SLURMD_PORT_FIRST + i - 1)) "slurmd $n"
done

# ---------------------------------------------------------------- munged
if pid_alive "$STATE/run/munged.pid" munged; then
  log "munged already running"
else
  [ -s "$STATE/munge/munge.key" ] || mungekey --create --keyfile="$STATE/munge/munge.key" --bits=1024
  chmod 600 "$STATE/munge/munge.key"
  rm -f "$STATE/run/munge.sock" "$STATE/run/munge.sock.lock" "$STATE/run/munged.pid"
  # --force: munged otherwise refuses a socket whose parent dirs are not world-searchable
  # (e.g. pytest's 0700 tmp dirs); with it that check only logs a warning.
  spawn "$STATE/log/munged.out" munged --force --socket="$STATE/run/munge.sock" \
         --key-file="$STATE/munge/munge.key" --pid-file="$STATE/run/munged.pid" \
         --log-file="$STATE/log/munged.log" --seed-file="$STATE/munge/munged.seed" \
    || die "munged failed: $(tail -n 3 "$STATE/log/munged.log" 2>/dev/null)"
  wait_for munged munge -n -S "$STATE/run/munge.sock"
  STARTED=1; log "munged up"
fi

# ---------------------------------------------------------------- mariadbd
MYSQL_SOCK="$STATE/run/mysqld.sock"
mysql_root() { mariadb --no-defaults -S "$MYSQL_SOCK" -uroot "$@"; }
if pid_alive "$STATE/run/mysqld.pid" mariadbd; then
  log "mariadbd already running"
else
  if [ ! -d "$STATE/mysql/mysql" ]; then
    mariadb-install-db --no-defaults --datadir="$STATE/mysql" --user=root \
      --auth-root-authentication-method=normal --skip-test-db \
      --innodb-log-file-size=32M >"$STATE/log/mysql-install.log" 2>&1 \
      || die "mariadb-install-db failed (see $STATE/log/mysql-install.log)"
  fi
  rm -f "$MYSQL_SOCK"
  need_port "$MYSQL_PORT" mariadbd
  rm -f "$STATE/run/mysqld.pid"
  # mariadbd does not daemonize itself
  spawn --bg "$STATE/log/mysqld.out" mariadbd --no-defaults --datadir="$STATE/mysql" \
    --socket="$MYSQL_SOCK" --port="$MYSQL_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
    --pid-file="$STATE/run/mysqld.pid" --log-error="$STATE/log/mysqld.err" --user=root \
    --innodb-buffer-pool-size=512M --innodb-log-file-size=32M --innodb-lock-wait-timeout=900 \
    --skip-log-bin
  disown || true
  wait_for --pid "$STATE/run/mysqld.pid" mariadbd "$STATE/log/mysqld.err" mariadbd mariadb-admin --no-defaults -S "$MYSQL_SOCK" -uroot ping
  mysql_root -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmtest';
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmtest';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
    FLUSH PRIVILEGES;"
  STARTED=1; log "mariadbd up (127.0.0.1:$MYSQL_PORT)"
fi

# ---------------------------------------------------------------- slurmdbd
if pid_alive "$STATE/run/slurmdbd.pid" slurmdbd; then
  log "slurmdbd already running"
else
  need_port "$DBD_PORT" slurmdbd
  rm -f "$STATE/run/slurmdbd.pid"
  spawn "$STATE/log/slurmdbd.out" slurmdbd || die "slurmdbd failed: $(tail -n 5 "$STATE/log/slurmdbd.log" 2>/dev/null)"
  wait_for --pid "$STATE/run/slurmdbd.pid" slurmdbd "$STATE/log/slurmdbd.log" "slurmdbd port $DBD_PORT" port_open "$DBD_PORT"
  STARTED=1; log "slurmdbd up (127.0.0.1:$DBD_PORT)"
fi
if ! sacctmgr -n -P show cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER"; then
  sacctmgr -i add cluster "$CLUSTER" >/dev/null || die "sacctmgr add cluster failed"
  log "cluster $CLUSTER registered in accounting"
fi

# ---------------------------------------------------------------- slurmctld
if pid_alive "$STATE/run/slurmctld.pid" slurmctld; then
  log "slurmctld already running"
else
  need_port "$CTLD_PORT" slurmctld
  rm -f "$STATE/run/slurmctld.pid"
  spawn "$STATE/log/slurmctld.out" slurmctld || die "slurmctld failed: $(tail -n 5 "$STATE/log/slurmctld.log" 2>/dev/null)"
  ctld_up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }
  wait_for --pid "$STATE/run/slurmctld.pid" slurmctld "$STATE/log/slurmctld.log" slurmctld ctld_up
  STARTED=1; log "slurmctld up (127.0.0.1:$CTLD_PORT)"
fi

# ---------------------------------------------------------------- slurmd x N
i=0
for n in "${NODE_NAMES[@]}"; do
  i=$((i + 1))
  if pid_alive "$STATE/run/slurmd-$n.pid" "slurmd -N $n"; then
    continue
  fi
  need_port $((SLURMD_PORT_FIRST + i - 1)) "slurmd $n"
  rm -f "$STATE/run/slurmd-$n.pid"
  spawn "$STATE/log/slurmd-$n.out" slurmd -N "$n" || die "slurmd $n failed: $(tail -n 5 "$STATE/log/slurmd-$n.log" 2>/dev/null)"
  STARTED=1; log "slurmd $n started (127.0.0.1:$((SLURMD_PORT_FIRST + i - 1)))"
done

# Ready = every node registered and responding. On a fresh state dir that means idle;
# a restart without --fresh keeps slurmctld's saved node states (e.g. DRAIN) and jobs.
count_nodes() { # regex on the long state [, allowed suffix regex]: how many nodes match
  sinfo -h -N -o '%N %T' 2>/dev/null | grep -cE " ($1)${2:-}\$" || true
}
all_registered() {
  local n
  for n in "${NODE_NAMES[@]}"; do
    if [ -s "$STATE/run/slurmd-$n.pid" ] && ! pid_alive "$STATE/run/slurmd-$n.pid" "slurmd -N $n"; then
      die "slurmd $n exited; last log lines:"$'\n'"$(tail -n 8 "$STATE/log/slurmd-$n.log" 2>/dev/null)"
    fi
  done
  [ "$(count_nodes 'idle|mixed|allocated|drained|draining|completing|reserved|planned')" -eq "$NODES" ]
}
if [ "$STARTED" = 1 ]; then
  wait_for "all $NODES nodes to register" all_registered
fi
if [ "$(count_nodes 'drained|draining|down|fail|failing|maint|reboot_issued|unknown' '[^ ]*')" -gt 0 ]; then
  log "WARNING: some nodes are drained/down (state kept from an earlier run? use --fresh):"
  sinfo -h -N -o '  %N %T %E' >&2 || true
elif [ "$(count_nodes idle)" -ne "$NODES" ]; then
  log "note: some nodes are running jobs"
fi
T1=$(date +%s.%N)

sinfo -N -o '%N %T %G %E' >&2 || true
log "ready in $(awk -v a="$T0" -v b="$T1" 'BEGIN{printf "%.1f", b-a}') s: $NODES nodes $NODELIST, cluster $CLUSTER"
cat >&2 <<EOF
[start-test-cluster] use:   export SLURM_CONF=$STATE/etc/slurm.conf   (or: . $STATE/env.sh)
[start-test-cluster] stop:  $HERE/stop-test-cluster.sh $STATE      (add --purge to delete the state dir)
EOF
# stdout: the SLURM_CONF value, handy for scripts:  SLURM_CONF=$(start-test-cluster.sh DIR)
echo "$STATE/etc/slurm.conf"
