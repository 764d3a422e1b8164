#!/usr/bin/env bash
# package-deb.sh: build the Debian packages of a dmover server and client
# (docs/packaging.md):
#   dmover_VERSION_ARCH.deb          the lean binary (no bench, no netlab: built
#                                    without the `lab` feature), stripped; the systemd
#                                    units, the sysusers entry, /etc/dmover/server.toml
#                                    (a conffile), the man pages, shell completions
#   dmover-dbgsym_VERSION_ARCH.deb   its debug information, by build id
#                                    (/usr/lib/debug/.build-id/), for gdb and crash reports
#
# Usage: scripts/package-deb.sh [--bin FILE] [--out DIR]
#   --bin FILE  package FILE (a dmover built with --no-default-features) instead of
#               building one with `cargo build --release --locked -p dmover
#               --no-default-features`
#   --out DIR   where the .deb files go (default: target/deb)
# Environment: DMOVER_DEB_VERSION (default: the crate's version, then +gitN.HASH in a
#   git checkout: N commits, so that a later commit's package is newer); DEBFULLNAME
#   and DEBEMAIL, the Maintainer field (as Debian's tools take them).
#
# Built with dpkg-deb from a staged tree, not cargo-deb: nothing to install beyond dpkg
# (and binutils' objcopy), every file, mode and maintainer script is in this one file,
# and the binary it packages is one cargo already built (no second build with other
# features). Needs: dpkg-deb, objcopy, gzip; a Rust toolchain unless --bin is given.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=
OUT=$REPO/target/deb
while [ $# -gt 0 ]; do
    case $1 in
        --bin) BIN=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "package-deb.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
done
for tool in dpkg-deb objcopy gzip; do
    command -v $tool >/dev/null || { echo "package-deb.sh: $tool is needed" >&2; exit 1; }
done

if [ -z "$BIN" ]; then
    (cd "$REPO" && cargo build --release --locked -p dmover --no-default-features)
    BIN=$REPO/target/release/dmover
fi
[ -x "$BIN" ] || { echo "package-deb.sh: $BIN is not an executable" >&2; exit 1; }
# The lean build says so when asked for a lab command (exit 2); the full one has them.
if "$BIN" netlab --help >/dev/null 2>&1; then
    echo "package-deb.sh: $BIN has the lab commands (bench, netlab): package a build made" \
        "with --no-default-features" >&2
    exit 1
fi

ARCH=$(dpkg --print-architecture)
VERSION=${DMOVER_DEB_VERSION:-}
if [ -z "$VERSION" ]; then
    VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO/Cargo.toml" | head -n1)
    if git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1; then
        VERSION="$VERSION+git$(git -C "$REPO" rev-list --count HEAD).$(git -C "$REPO" rev-parse --short HEAD)"
    fi
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PKG=$WORK/dmover
DBG=$WORK/dmover-dbgsym
install -d "$PKG/DEBIAN" "$DBG/DEBIAN"

# The binary, stripped; its debug information kept apart, found by its build id.
BUILD_ID=$(readelf -n "$BIN" | sed -n 's/.*Build ID: \([0-9a-f]*\).*/\1/p')
[ -n "$BUILD_ID" ] || { echo "package-deb.sh: $BIN has no build id" >&2; exit 1; }
install -d "$PKG/usr/bin" "$DBG/usr/lib/debug/.build-id/${BUILD_ID:0:2}"
DEBUG_FILE=$DBG/usr/lib/debug/.build-id/${BUILD_ID:0:2}/${BUILD_ID:2}.debug
objcopy --only-keep-debug --compress-debug-sections "$BIN" "$DEBUG_FILE"
chmod 0644 "$DEBUG_FILE"
objcopy --strip-all --add-gnu-debuglink="$DEBUG_FILE" "$BIN" "$PKG/usr/bin/dmover"
chmod 0755 "$PKG/usr/bin/dmover"
DMOVER=$PKG/usr/bin/dmover

# systemd: the server's unit, the sync --watch template, the service user.
install -D -m 0644 "$REPO/packaging/dmover.service" "$PKG/usr/lib/systemd/system/dmover.service"
install -D -m 0644 "$REPO/packaging/dmover-sync@.service" \
    "$PKG/usr/lib/systemd/system/dmover-sync@.service"
install -D -m 0644 "$REPO/packaging/dmover.sysusers" "$PKG/usr/lib/sysusers.d/dmover.conf"
# The example configuration, a conffile: dpkg keeps the operator's edits on upgrades.
install -D -m 0640 "$REPO/packaging/server.toml" "$PKG/etc/dmover/server.toml"
install -d -m 0750 "$PKG/etc/dmover/sync"

# Man pages and completions, from the binary itself.
install -d "$PKG/usr/share/man/man1"
"$DMOVER" man --dir "$PKG/usr/share/man/man1"
gzip -9n "$PKG"/usr/share/man/man1/*.1
install -d "$PKG/usr/share/bash-completion/completions" "$PKG/usr/share/zsh/vendor-completions" \
    "$PKG/usr/share/fish/vendor_completions.d"
"$DMOVER" completions bash >"$PKG/usr/share/bash-completion/completions/dmover"
"$DMOVER" completions zsh >"$PKG/usr/share/zsh/vendor-completions/_dmover"
"$DMOVER" completions fish >"$PKG/usr/share/fish/vendor_completions.d/dmover.fish"

# Documentation: the operator's page, the example settings of a sync --watch instance.
DOC=$PKG/usr/share/doc/dmover
install -D -m 0644 "$REPO/docs/packaging.md" "$DOC/packaging.md"
install -D -m 0644 "$REPO/docs/config.md" "$DOC/config.md"
install -D -m 0644 "$REPO/packaging/sync.env" "$DOC/examples/sync.env"
cat >"$DOC/copyright" <<'EOF'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: dmover
Source: https://github.com/dmover/dmover

Files: *
Copyright: the dmover authors
License: Apache-2.0 or MIT
 On Debian systems the Apache License 2.0 is in /usr/share/common-licenses/Apache-2.0.
EOF
install -d "$DBG/usr/share/doc"
ln -s dmover "$DBG/usr/share/doc/dmover-dbgsym"

# Dependencies: the shared libraries the binary links, at the newest glibc symbol
# version it uses (what dpkg-shlibdeps would find for these libraries).
GLIBC=$(objdump -T "$BIN" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1)
DEPENDS="libc6 (>= $GLIBC)"
if readelf -d "$BIN" | grep -q 'NEEDED.*libgcc_s.so.1'; then
    DEPENDS="$DEPENDS, libgcc-s1"
fi
others=$(readelf -d "$BIN" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' \
    | grep -v -E '^(libc|libm|libdl|libpthread|librt|libgcc_s)\.so|^ld-linux' || true)
if [ -n "$others" ]; then
    echo "package-deb.sh: $BIN links libraries this script has no package for: $others" >&2
    exit 1
fi

size_kib() { du -k -s --apparent-size "$1" | cut -f1; }
cat >"$PKG/DEBIAN/control" <<EOF
Package: dmover
Version: $VERSION
Architecture: $ARCH
Maintainer: ${DEBFULLNAME:-dmover packager} <${DEBEMAIL:-dmover@invalid}>
Installed-Size: $(size_kib "$PKG")
Depends: $DEPENDS
Recommends: systemd
Suggests: dmover-dbgsym
Section: net
Priority: optional
Homepage: https://github.com/dmover/dmover
Description: data mover for Data Transfer Nodes
 Moves files and trees between hosts over many parallel TCP streams, checksums
 every chunk and file end to end, and never shows a partial file under its final
 name. One binary is the server (dmover serve, a systemd unit with a sysusers
 entry and an example /etc/dmover/server.toml) and the client (dmover cp, sync,
 sync --watch with a template unit, mount, submit). Built without the lab's
 commands (bench, netlab).
EOF
cat >"$DBG/DEBIAN/control" <<EOF
Package: dmover-dbgsym
Version: $VERSION
Architecture: $ARCH
Maintainer: ${DEBFULLNAME:-dmover packager} <${DEBEMAIL:-dmover@invalid}>
Installed-Size: $(size_kib "$DBG")
Depends: dmover (= $VERSION)
Section: debug
Priority: optional
Homepage: https://github.com/dmover/dmover
Description: debug symbols for dmover
 The debug information (line tables) of /usr/bin/dmover, found by gdb through its
 build id.
Build-Ids: $BUILD_ID
EOF
echo /etc/dmover/server.toml >"$PKG/DEBIAN/conffiles"

# Maintainer scripts. The service user first (systemd-sysusers, else useradd). The
# server is not started nor enabled on a first install: the packaged server.toml is an
# example (placeholder exports, users whose secrets were thrown away), so the operator
# writes the configuration, then enables it. An upgrade restarts a running server and
# running sync --watch instances (try-restart: stopped ones stay stopped).
cat >"$PKG/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    if ! getent passwd dmover >/dev/null; then
        if command -v systemd-sysusers >/dev/null 2>&1; then
            systemd-sysusers /usr/lib/sysusers.d/dmover.conf
        else
            useradd --system --user-group --home-dir /var/lib/dmover --no-create-home \
                --shell /usr/sbin/nologin --comment "dmover data mover" dmover
        fi
    fi
    # The configuration holds token verifiers: readable by the server, not by all.
    if ! dpkg-statoverride --list /etc/dmover/server.toml >/dev/null 2>&1; then
        chown root:dmover /etc/dmover/server.toml /etc/dmover/sync
        chmod 0640 /etc/dmover/server.toml
        chmod 0750 /etc/dmover/sync
    fi
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload || true
        if [ -n "$2" ]; then
            systemctl try-restart dmover.service 'dmover-sync@*.service' || true
        else
            echo "dmover: edit /etc/dmover/server.toml (exports, users), then:" \
                "systemctl enable --now dmover (docs: /usr/share/doc/dmover/packaging.md)"
        fi
    fi
fi
exit 0
EOF
cat >"$PKG/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    systemctl stop dmover.service 'dmover-sync@*.service' || true
fi
exit 0
EOF
cat >"$PKG/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = remove ] || [ "$1" = purge ]; then
    if [ -d /run/systemd/system ]; then
        systemctl disable dmover.service >/dev/null 2>&1 || true
        systemctl daemon-reload || true
    fi
fi
# The server's key in /var/lib/dmover (its identity, pinned by its clients) and the
# service user are kept, also on purge: remove them by hand when done with them.
exit 0
EOF
chmod 0755 "$PKG/DEBIAN/postinst" "$PKG/DEBIAN/prerm" "$PKG/DEBIAN/postrm"

for dir in "$PKG" "$DBG"; do
    (cd "$dir" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' \
        | LC_ALL=C sort -z | xargs -0 -r md5sum >DEBIAN/md5sums)
done

mkdir -p "$OUT"
dpkg-deb --root-owner-group -Zxz --build "$PKG" "$OUT/dmover_${VERSION}_${ARCH}.deb" >/dev/null
dpkg-deb --root-owner-group -Zxz --build "$DBG" \
    "$OUT/dmover-dbgsym_${VERSION}_${ARCH}.deb" >/dev/null
for deb in "$OUT/dmover_${VERSION}_${ARCH}.deb" "$OUT/dmover-dbgsym_${VERSION}_${ARCH}.deb"; do
    echo "$deb ($(stat -c %s "$deb") bytes)"
done
echo "stripped /usr/bin/dmover: $(stat -c %s "$DMOVER") bytes"
