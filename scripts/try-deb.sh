#!/usr/bin/env bash
# try-deb.sh: install the package scripts/package-deb.sh built, start the server as its
# unit does, and check that it answers: a file pushed to it and pulled back, compared,
# by a user of a throwaway configuration; the server's process runs as the user dmover
# with CAP_NET_ADMIN and no other capability (docs/packaging.md).
#
# Usage: scripts/try-deb.sh [DEB]   (as root, on a machine to try packages on)
#   DEB: default, the newest target/deb/dmover_*.deb.
# Environment: TRY_PORT (default 17700), the port the tried server listens on
#   (loopback only).
#
# Where systemd runs (PID 1) it starts the unit itself: a drop-in in /run (gone at the
# next boot) points its ExecStart at the throwaway configuration, then
# `systemctl start dmover`. Without systemd (a container), it runs the unit's ExecStart
# line itself, as the unit's User= with its capabilities (setpriv), the configuration
# swapped the same way. The throwaway configuration has a state directory of its own:
# the key of a server installed here is not touched. Either way the package stays
# installed; the server is stopped, and the drop-in, configuration and data go.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEB=${1:-$(ls -t "$REPO"/target/deb/dmover_*.deb 2>/dev/null | head -n1)}
PORT=${TRY_PORT:-17700}
[ "$(id -u)" = 0 ] || { echo "try-deb.sh: run as root (it installs a package)" >&2; exit 1; }
[ -f "$DEB" ] || { echo "try-deb.sh: no package (scripts/package-deb.sh makes one)" >&2; exit 1; }

say() { echo "try-deb: $*"; }
fail() { echo "try-deb: FAILED: $*" >&2; exit 1; }

say "installing $DEB"
dpkg -i "$DEB"
UNIT=/usr/lib/systemd/system/dmover.service
for f in /usr/bin/dmover "$UNIT" /usr/lib/systemd/system/dmover-sync@.service \
    /usr/lib/sysusers.d/dmover.conf /etc/dmover/server.toml \
    /usr/share/man/man1/dmover.1.gz /usr/share/man/man1/dmover-serve.1.gz \
    /usr/share/bash-completion/completions/dmover; do
    [ -e "$f" ] || fail "the package did not install $f"
done
getent passwd dmover >/dev/null || fail "no user dmover after the install"
[ "$(stat -c %U:%G:%a /etc/dmover/server.toml)" = root:dmover:640 ] \
    || fail "/etc/dmover/server.toml is $(stat -c %U:%G:%a /etc/dmover/server.toml)"
say "installed: $(dmover --version)"
# The lean build: no lab commands, and it says so.
if dmover bench --help >/dev/null 2>&1; then fail "the packaged dmover has bench"; fi
if command -v systemd-analyze >/dev/null; then
    systemd-analyze verify "$UNIT" /usr/lib/systemd/system/dmover-sync@try.service
    say "systemd-analyze verify: the installed units pass"
fi

# A throwaway configuration: one export, one user with a token, a state directory of
# its own (a server installed here keeps its key). Under /var/lib, not /tmp: the unit's
# PrivateTmp= gives the server a /tmp of its own.
TRY=/var/lib/dmover-try
rm -rf "$TRY"
install -d -m 0755 "$TRY"
install -d -o dmover -g dmover "$TRY/export"
install -d -m 0700 -o dmover -g dmover "$TRY/state"
TOKEN_LINE=$(dmover credential token "$TRY/token" 2>/dev/null)
cat >"$TRY/server.toml" <<EOF
listen = "127.0.0.1:$PORT"
state_dir = "$TRY/state"
[exports.data]
path = "$TRY/export"
[users.try]
$TOKEN_LINE
exports = { data = "rw" }
EOF
chmod 0644 "$TRY/server.toml"
runuser -u dmover -- dmover serve --check --config "$TRY/server.toml"
EXEC=$(sed -n 's/^ExecStart=//p' "$UNIT")
EXEC=${EXEC/\/etc\/dmover\/server.toml/$TRY/server.toml}
USER_=$(sed -n 's/^User=//p' "$UNIT")
CAPS=$(sed -n 's/^AmbientCapabilities=//p' "$UNIT")

PID=
DROPIN=/run/systemd/system/dmover.service.d/try.conf
stop() {
    if [ -f "$DROPIN" ]; then
        systemctl stop dmover.service || true
        rm -f "$DROPIN"
        systemctl daemon-reload || true
    elif [ -n "$PID" ]; then
        kill -TERM "$PID" 2>/dev/null || true
        wait "$PID" 2>/dev/null || true
    fi
    rm -rf "$TRY"
}
trap stop EXIT

if [ "$(cat /proc/1/comm)" = systemd ]; then
    say "systemd runs here: starting dmover.service with a drop-in ($DROPIN)"
    install -d "$(dirname "$DROPIN")"
    printf '[Service]\nExecStart=\nExecStart=%s\nReadWritePaths=%s %s\n' "$EXEC" \
        "$TRY/export" "$TRY/state" >"$DROPIN"
    systemctl daemon-reload
    systemctl start dmover.service
    PID=$(systemctl show -p MainPID --value dmover.service)
    systemctl is-active --quiet dmover.service || fail "dmover.service is not active"
else
    say "no systemd here (PID 1 is $(cat /proc/1/comm)): running the unit's ExecStart" \
        "as $USER_ with $CAPS"
    caps=$(echo "$CAPS" | tr 'A-Z' 'a-z' | sed 's/cap_/+/g; s/ /,/g')
    # shellcheck disable=SC2086 # the ExecStart line's words, as systemd splits them
    setpriv --reuid="$USER_" --regid="$USER_" --init-groups --no-new-privs \
        --inh-caps="$caps" --ambient-caps="$caps" --bounding-set="-all,$caps" \
        -- $EXEC >"$TRY/server.out" 2>"$TRY/server.err" &
    PID=$!
fi
for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    kill -0 "$PID" 2>/dev/null || fail "the server exited: $(cat "$TRY/server.err" 2>/dev/null)"
    sleep 0.1
done
say "the server listens on 127.0.0.1:$PORT (pid $PID)"

status=$(cat "/proc/$PID/status")
owner=$(stat -c %U "/proc/$PID")
[ "$owner" = "$USER_" ] || fail "the server runs as $owner, not $USER_"
# CAP_NET_ADMIN is capability 12: 0x1000, and nothing else.
for set in CapEff CapAmb CapBnd; do
    value=$(echo "$status" | sed -n "s/^$set:[[:space:]]*//p")
    [ "$value" = 0000000000001000 ] || fail "$set of the server is $value, not CAP_NET_ADMIN alone"
done
say "the server runs as $owner with CAP_NET_ADMIN only (CapEff, CapAmb, CapBnd 0x1000)"

head -c 10000000 /dev/urandom >"$TRY/sent"
client=(--user try --token-file "$TRY/token" --known-hosts "$TRY/known_hosts" --quiet)
dmover cp "${client[@]}" "$TRY/sent" "dmover://127.0.0.1:$PORT/data/sent"
dmover cp "${client[@]}" "dmover://127.0.0.1:$PORT/data/sent" "$TRY/back"
cmp "$TRY/sent" "$TRY/back" || fail "the file pulled back differs"
[ "$(stat -c %U "$TRY/export/sent")" = "$USER_" ] || fail "the pushed file is not $USER_'s"
say "pushed 10 MB to it and pulled them back, identical: the packaged server works"
