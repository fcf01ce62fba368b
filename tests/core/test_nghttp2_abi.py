"""ratelimitd/transport/_nghttp2.h against the real nghttp2/nghttp2.h: same layouts, constants and
prototypes, and every name _nghttp2.pxd uses is declared there.

The HTTP/2 core is built from our own declarations so that it needs only the runtime
library; a wrong offset there would not fail the build, it would read the wrong bytes. The
real header comes with libnghttp2-dev, which `scripts/bootstrap.sh --system` installs for
this test: its absence fails the test, as any missing tool does in CI.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from support import REPO

HEADER = REPO / "ratelimitd" / "transport" / "_nghttp2.h"
PXD = REPO / "ratelimitd" / "transport" / "_nghttp2.pxd"
SYSTEM_HEADER = Path("/usr/include/nghttp2/nghttp2.h")

# (struct, members) whose layout _h2 depends on: it allocates or reads each of these.
LAYOUTS = {
    "nghttp2_frame_hd": ("length", "stream_id", "type", "flags", "reserved"),
    "nghttp2_nv": ("name", "value", "namelen", "valuelen", "flags"),
    "nghttp2_priority_spec": ("stream_id", "weight", "exclusive"),
    "nghttp2_headers": ("hd", "padlen", "pri_spec", "nva", "nvlen", "cat"),
    "nghttp2_ping": ("hd", "opaque_data"),
    "nghttp2_data_provider": ("source", "read_callback"),
    "nghttp2_settings_entry": ("settings_id", "value"),
    "nghttp2_data_source": ("fd", "ptr"),
}
# Union members _h2 reads from a frame the library hands it: offset 0 in both.
FRAME_MEMBERS = ("hd", "headers", "ping")


def constants() -> list[str]:
    """The NGHTTP2_* constants our header defines."""
    return sorted(set(re.findall(r"\b(NGHTTP2_[A-Z0-9_]+) = ", HEADER.read_text())))


def probe_source() -> str:
    """A C program printing every size, offset and constant of LAYOUTS and constants()."""
    lines = ["#include <stdio.h>", "#include <stddef.h>", "int main(void) {"]
    for struct, members in LAYOUTS.items():
        lines.append(f'printf("sizeof {struct} %zu\\n", sizeof({struct}));')
        for m in members:
            lines.append(f'printf("{struct}.{m} %zu\\n", offsetof({struct}, {m}));')
    for m in FRAME_MEMBERS:
        lines.append(f'printf("nghttp2_frame.{m} %zu\\n", offsetof(nghttp2_frame, {m}));')
    for name in constants():
        lines.append(f'printf("{name} %ld\\n", (long){name});')
    lines += ["return 0;", "}"]
    return "\n".join(lines) + "\n"


def compile_c(tmp: Path, name: str, source: str, *flags: str) -> Path:
    """Compile `source` with gcc -Werror; the executable's path."""
    src = tmp / f"{name}.c"
    src.write_text(source)
    exe = tmp / name
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed (the extensions are built with it)"
    done = subprocess.run(
        [cc, "-std=c11", "-Wall", "-Werror", *flags, str(src), "-o", str(exe)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return exe


def test_the_real_header_is_installed_for_these_checks() -> None:
    assert SYSTEM_HEADER.is_file(), "libnghttp2-dev is missing: run scripts/bootstrap.sh --system"


def test_layouts_and_constants_match_the_real_header(tmp_path: Path) -> None:
    source = probe_source()
    ours = compile_c(tmp_path, "ours", source, "-include", str(HEADER))
    real = compile_c(tmp_path, "real", source, "-include", "nghttp2/nghttp2.h")
    got = subprocess.run([ours], capture_output=True, text=True, check=True).stdout
    want = subprocess.run([real], capture_output=True, text=True, check=True).stdout
    assert got.splitlines() == want.splitlines()
    assert "NGHTTP2_ERR_FLOODED -904" in got  # the probe printed the constants too


def test_prototypes_are_the_real_ones(tmp_path: Path) -> None:
    # Declaring a function again with another type is a compile error in C: our prototypes,
    # after the real header, must be exactly its declarations.
    source = (
        "#include <nghttp2/nghttp2.h>\n"
        "#define RATELIMITD_NGHTTP2_PROTOTYPES_ONLY\n"
        f'#include "{HEADER}"\n'
        "int main(void) { return 0; }\n"
    )
    compile_c(tmp_path, "prototypes", source)


def test_every_name_the_pxd_uses_is_declared() -> None:
    # The compiler would only warn about a function _h2 calls that our header lacks. The
    # header's names are read after the preprocessor (it declares the setters by a macro).
    pxd = PXD.read_text()
    body = pxd[pxd.index("cdef extern from") :]
    names = r"\b(nghttp2_[a-z0-9_]+|NGHTTP2_[A-Z0-9_]+)\b"
    used = set(re.findall(names, body))
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed (the extensions are built with it)"
    expanded = subprocess.run(
        [cc, "-E", "-P", str(HEADER)], capture_output=True, text=True, check=True
    ).stdout
    assert used, "no names found in the pxd"
    assert sorted(used - set(re.findall(names, expanded))) == []
