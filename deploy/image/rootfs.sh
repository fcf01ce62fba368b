#!/bin/sh
# The runtime's files under ROOTFS (deploy/Containerfile): Python and what it and the wheels
# load, copied out of this stage's Debian packages, as distroless images are made. No shell,
# apt, dpkg or coreutils: the images run Python and nothing else.
set -eu
rootfs=$1
# The C library, Python 3.11 and the libraries its standard modules and the wheels load
# (libstdc++ for grpcio, libnghttp2 for the native HTTP/2 core), the time zones, /etc/services.
packages="libc6 libgcc-s1 libstdc++6 libssl3 libffi8 zlib1g libexpat1 libsqlite3-0 libbz2-1.0
liblzma5 libcrypt1 libuuid1 libnghttp2-14 libpython3.11-minimal
libpython3.11-stdlib python3.11-minimal tzdata netbase"
mkdir -p "$rootfs"
# Debian's merged /usr: /bin, /lib, /lib64 and /sbin are links into /usr (the dynamic
# loader is found through /lib64 or /lib).
for link in bin lib lib64 sbin; do
    if [ -L "/$link" ]; then
        mkdir -p "$rootfs/$(readlink "/$link")"
        cp -a "/$link" "$rootfs/"
    fi
done
mkdir -p "$rootfs/var/lib/dpkg/status.d"
for package in $packages; do
    dpkg-query -L "$package" | while read -r path; do
        if [ -f "$path" ] || [ -L "$path" ]; then
            cp -a --parents "$path" "$rootfs/"
        fi
    done
    # What scanners read to list an image's packages (distroless keeps the same records).
    dpkg-query -s "$package" >"$rootfs/var/lib/dpkg/status.d/$package"
done
# Standard modules whose libraries are not here (curses, readline, dbm, NIS, Tk): not
# importable either way; leaving them out says so.
find "$rootfs/usr/lib/python3.11/lib-dynload" \( -name '_curses*' -o -name 'readline*' \
    -o -name '_dbm*' -o -name '_gdbm*' -o -name 'nis*' \) -delete
rm -rf "$rootfs/usr/share/doc" "$rootfs/usr/share/man" "$rootfs/usr/share/lintian" \
    "$rootfs/usr/lib/python3.11/test" "$rootfs/usr/lib/python3.11/idlelib" \
    "$rootfs/usr/lib/python3.11/ensurepip" "$rootfs/usr/lib/python3.11/lib2to3" \
    "$rootfs/usr/lib/python3.11/pydoc_data"
ln -sf python3.11 "$rootfs/usr/bin/python3"
# The CA bundle (update-ca-certificates made it in this stage) where OpenSSL looks for it.
mkdir -p "$rootfs/etc/ssl/certs" "$rootfs/usr/lib/ssl"
cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
ln -s /etc/ssl/certs/ca-certificates.crt "$rootfs/usr/lib/ssl/cert.pem"
ln -s /etc/ssl/certs "$rootfs/usr/lib/ssl/certs"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' \
    >"$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
install -d -m 1777 "$rootfs/tmp"
install -d "$rootfs/opt" "$rootfs/etc" "$rootfs/dev" "$rootfs/proc" "$rootfs/sys"
# The standard library's byte code (Debian compiles it when the package is installed, so
# the package's file list has none), with hashes: reproducible, never rewritten. A fixed
# hash seed: a set literal's constant is marshalled in its iteration order.
PYTHONHASHSEED=0 PYTHONDONTWRITEBYTECODE=1 chroot "$rootfs" /usr/bin/python3.11 -m compileall -q -f \
    --invalidation-mode unchecked-hash /usr/lib/python3.11
chroot "$rootfs" /usr/bin/python3.11 -c 'import ssl, sqlite3, lzma, bz2, ctypes, uuid, zoneinfo, decimal; ssl.create_default_context()'
