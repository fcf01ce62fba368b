#!/bin/sh
# The image's venv at /opt/ratelimitd with REQUIREMENT installed from /wheels (deploy/Containerfile's
# build stage): no pip in it, no C or Cython sources (.pyx, .pxd, .pxi, .c, .h: ratelimitd's
# and those uvloop and httptools ship), the compiled
# modules stripped (their debug sections carry build paths), and byte code compiled once
# with unchecked hashes: no source timestamps in it (two builds make the same files), and
# nothing to rewrite at run time on a read-only root.
set -eu
requirement=$1
python3 -m venv --without-pip /opt/ratelimitd
/opt/build/bin/pip --python /opt/ratelimitd/bin/python install -q --no-index \
    --find-links /wheels --no-compile "$requirement"
site=$(echo /opt/ratelimitd/lib/python3*/site-packages)
find "$site" -type f \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' \
    -o -name '*.c' -o -name '*.h' \) -delete
find "$site" -name '*.so*' -type f -exec strip --strip-unneeded {} +
# A fixed hash seed: a set literal's constant is marshalled in its iteration order.
PYTHONHASHSEED=0 PYTHONDONTWRITEBYTECODE=1 /opt/ratelimitd/bin/python -m compileall -q -f -j 0 \
    --invalidation-mode unchecked-hash "$site"
