#!/bin/bash
# Prepares the kernel matrix of tests/kernels, once per kernel release:
# qemu and virtme-ng to boot a kernel with this machine's filesystem, and
# Debian's newest 6.1 and 6.12 kernel packages, unpacked (not installed)
# with their modules indexed. Everything is cached under $CACHE.
set -euo pipefail
CACHE=${LATTRACE_CACHE:-/var/cache/lattrace}
# udev: without it virtme-ng's init finds no script I/O port and every run
# exits 255; kmod: depmod for the unpacked modules; busybox-static: the
# guest's init.
PKGS="qemu-system-x86 busybox-static kmod udev python3-venv"
VIRTME_NG=1.42
# The series production nodes run (Debian 12's, and 13's/RHEL 10's).
SERIES=('^linux-image-6\.1\.0-[0-9]+-amd64$' '^linux-image-6\.12\.[0-9]+\+deb12-amd64$')

missing=$(for p in $PKGS; do dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' || echo "$p"; done)
updated=
if [ -n "$missing" ]; then
	echo "installing:" $missing
	apt-get update -qq && updated=1
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

if [ ! -x "$CACHE/vng/bin/vng" ]; then
	echo "installing virtme-ng $VIRTME_NG into $CACHE/vng"
	rm -rf "$CACHE/vng"
	python3 -m venv "$CACHE/vng"
	"$CACHE/vng/bin/pip" install -q "virtme-ng==$VIRTME_NG"
fi

mkdir -p "$CACHE/kernels"
for pattern in "${SERIES[@]}"; do
	pkg=$(apt-cache search --names-only "$pattern" | awk '{print $1}' | sort -V | tail -1)
	if [ -z "$pkg" ] && [ -z "$updated" ]; then
		apt-get update -qq && updated=1
		pkg=$(apt-cache search --names-only "$pattern" | awk '{print $1}' | sort -V | tail -1)
	fi
	if [ -z "$pkg" ]; then
		echo "no Debian package matches $pattern" >&2
		exit 1
	fi
	release=${pkg#linux-image-}
	dir="$CACHE/kernels/$release"
	[ -e "$dir/boot/vmlinuz-$release" ] && [ -e "$dir/lib/modules/$release/modules.dep.bin" ] && continue
	echo "fetching $pkg"
	tmp=$(mktemp -d)
	(cd "$tmp" && apt-get download -qq "$pkg" 2>/dev/null)
	rm -rf "$dir.partial" && mkdir -p "$dir.partial"
	dpkg -x "$tmp"/*.deb "$dir.partial"
	depmod -b "$dir.partial" "$release"
	rm -rf "$tmp" "$dir" && mv "$dir.partial" "$dir"
done
