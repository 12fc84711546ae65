#!/usr/bin/env bash
# Installs and starts what the sandboxes need on a Debian/Ubuntu machine (as root):
# docker.io, bubblewrap, debootstrap, libseccomp2; agentrl's unprivileged host uid range
# (/etc/subuid, /etc/subgid); a running dockerd; the sandbox image.
# Idempotent: every step checks first. Usage: scripts/system_setup.sh [--no-docker]
set -euo pipefail
want_docker=1
[ "${1:-}" = "--no-docker" ] && want_docker=0

log() { printf '[setup] %s\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
  log "not root: skipping apt and dockerd (install docker.io bubblewrap debootstrap yourself)"
  exit 0
fi

pkgs=()
command -v bwrap >/dev/null || pkgs+=(bubblewrap)
command -v debootstrap >/dev/null || pkgs+=(debootstrap)
ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' || pkgs+=(libseccomp2)
if [ "$want_docker" = 1 ]; then
  command -v dockerd >/dev/null || pkgs+=(docker.io)
fi
if [ "${#pkgs[@]}" -gt 0 ]; then
  log "apt-get install ${pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
fi

# Sandbox uids of the bwrap backend map onto this range, never onto host root: one slot of it per
# running sandbox (sandbox.identity.SLOTS), so per-user kernel budgets are per sandbox.
python -m sandbox.identity setup

# Links, regular files and FIFOs planted in a sticky world-writable dir (/tmp) by one uid must not be
# followed or opened for writing by another (the judge): the kernel's protected_* checks, persistently.
# They are global (not per namespace), so a sandbox cannot set them itself. See docs/sandbox-judge.md.
protected=(fs.protected_symlinks=1 fs.protected_hardlinks=1 fs.protected_regular=2 fs.protected_fifos=2)
if [ -d /etc/sysctl.d ]; then
  printf '%s\n' "# agentrl: judge and model share /tmp (scripts/system_setup.sh)" "${protected[@]}" \
    >/etc/sysctl.d/60-agentrl-protected.conf
fi
for kv in "${protected[@]}"; do
  knob="/proc/sys/$(printf '%s' "${kv%%=*}" | tr . /)"  # /proc/sys directly: procps may be absent
  [ "$(cat "$knob" 2>/dev/null)" = "${kv#*=}" ] || { echo "${kv#*=}" >"$knob"; } 2>/dev/null \
    || log "cannot set $kv here (read-only /proc/sys?): a judge that writes in /tmp can be redirected"
done

if [ "$want_docker" = 1 ]; then
  if ! docker info >/dev/null 2>&1; then
    log "starting dockerd (log: /var/log/agentrl-dockerd.log)"
    nohup dockerd >/var/log/agentrl-dockerd.log 2>&1 &
    for _ in $(seq 1 60); do
      docker info >/dev/null 2>&1 && break
      sleep 1
    done
    docker info >/dev/null 2>&1 || { log "dockerd did not come up:"; tail -n 30 /var/log/agentrl-dockerd.log; exit 1; }
  fi
  log "dockerd is running ($(docker version --format '{{.Server.Version}}'))"
  python -m sandbox.images build
else
  python -m sandbox.images build --no-docker
fi
