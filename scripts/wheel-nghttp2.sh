#!/usr/bin/env bash
# cibuildwheel's before-all on manylinux (pyproject.toml, [tool.cibuildwheel]): libnghttp2
# built from its tagged source, library only, into /usr/local. The native HTTP/2 core needs
# nghttp2 1.61 or later (nghttp2_option_set_max_continuations; Debian 12 carries it as a
# security backport) and the manylinux images' distributions ship older ones, so the
# release wheels are built against this one and `auditwheel repair` copies it into the wheel
# (ratelimitd.libs/): a wheel from PyPI needs no libnghttp2 on the machine.
set -euo pipefail
TAG=v1.64.0
COMMIT=526ff38e0249acbcc4d0e8958c12cdeae9960cfe
src=$(mktemp -d)
git clone --quiet --depth 1 --branch "$TAG" https://github.com/nghttp2/nghttp2 "$src"
[[ "$(git -C "$src" rev-parse HEAD)" == "$COMMIT" ]] || { echo "nghttp2 $TAG is not $COMMIT" >&2; exit 1; }
cmake -S "$src" -B "$src/build" -DENABLE_LIB_ONLY=ON -DBUILD_SHARED_LIBS=ON \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr/local -DCMAKE_INSTALL_LIBDIR=lib
cmake --build "$src/build" --parallel "$(nproc)"
cmake --install "$src/build"
echo /usr/local/lib >/etc/ld.so.conf.d/nghttp2.conf
ldconfig
