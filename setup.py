"""Build the two compiled cores (descriptor trie and cache-key maths) with Cython.

`pip install .` runs this in an isolated build env with Cython present; the generated
C files are build output and never committed.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension("ratelimitd._match", ["ratelimitd/_match.pyx"]),
    Extension("ratelimitd._keys", ["ratelimitd/_keys.pyx"]),
    # The RLS protobuf codec of the gRPC hot path (twin: the upb classes in protocodec.py).
    Extension("ratelimitd._wire", ["ratelimitd/_wire.pyx"]),
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "embedsignature": True,
        },
    ),
)
