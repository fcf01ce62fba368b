"""Build the compiled cores (descriptor trie, cache-key maths, decision model, wire codec,
HTTP/2, the Redis counter codec and round) with Cython.

`pip install .` runs this in an isolated build env with Cython present; the generated
C files are build output and never committed. The HTTP/2 core links the system libnghttp2 by
its soname, libnghttp2.so.14 (Debian: libnghttp2-14, the runtime library alone: the
declarations it needs are in ratelimitd/transport/_nghttp2.h, so no libnghttp2-dev). It is optional
only where that library is missing: the build then skips it and the daemon serves gRPC with
grpc.aio instead. Where the library is there, a compile error fails the build, so a broken
HTTP/2 core can never install silently as "not built".
"""

import ctypes.util
import glob
import sys
from importlib import resources

from Cython.Build import cythonize
from setuptools import Extension, setup

# Protobuf and gRPC modules, generated from the vendored Envoy definitions under
# proto/third_party/ (protoc's own header says such gencode is not to be checked in). That folder
# is the include root, so protoc still sees `ratelimitd/_proto/*.proto` and the modules stay
# `ratelimitd._proto.*_pb2`. grpcio-tools is a build requirement pinned to the version whose protoc
# matches the runtime `protobuf` floor in pyproject.toml.
PROTOS = sorted(glob.glob("proto/third_party/ratelimitd/_proto/*.proto"))
SERVICES = [
    "proto/third_party/ratelimitd/_proto/rls.proto",
    "proto/third_party/ratelimitd/_proto/discovery.proto",
    "proto/third_party/ratelimitd/_proto/rlqs.proto",
]


def generate_protos() -> None:
    """Write ratelimitd/_proto/*_pb2.py(i) and *_pb2_grpc.py from proto/third_party/
    (as `make proto`)."""
    from grpc_tools import protoc

    include = f"-I{resources.files('grpc_tools') / '_proto'}"  # the well-known types
    for argv in (
        ["-Iproto/third_party", include, "--python_out=.", "--pyi_out=.", *PROTOS],
        ["-Iproto/third_party", include, "--grpc_python_out=.", *SERVICES],
    ):
        if protoc.main(["protoc", *argv]) != 0:
            sys.exit(f"protoc failed: {' '.join(argv)}")


generate_protos()

extensions = [
    Extension("ratelimitd.config._match", ["ratelimitd/config/_match.pyx"]),
    Extension("ratelimitd.config._keys", ["ratelimitd/config/_keys.pyx"]),
    # Plan, count, verdict: the decision of every request, in two modules (no twin: the
    # process does not start without them).
    Extension("ratelimitd.decision._plan", ["ratelimitd/decision/_plan.pyx"]),
    Extension("ratelimitd.decision._decision", ["ratelimitd/decision/_decision.pyx"]),
    # The RLS protobuf codec of the gRPC hot path (twin: the upb classes in protocodec.py).
    Extension("ratelimitd.transport._wire", ["ratelimitd/transport/_wire.pyx"]),
    # The ShouldRateLimit call and the native routes (twins: transport/rls.py, native.py).
    Extension("ratelimitd.transport._rls", ["ratelimitd/transport/_rls.pyx"]),
    # Token budgets' maths in process memory, compiled in Cython's pure-Python mode (types in
    # memory_budget.pxd): the same memory_budget.py runs uncompiled where this is not built.
    Extension("ratelimitd.backends.memory_budget", ["ratelimitd/backends/memory_budget.py"]),
    # Its transaction records and their heap, compiled the same way (budget_txns.pxd).
    Extension("ratelimitd.backends.budget_txns", ["ratelimitd/backends/budget_txns.py"]),
    # A budget call's way through the decision (plan, store call, status), compiled the same
    # way (types in calls.pxd): the compiled decision calls it for budget items only.
    Extension("ratelimitd.budget.calls", ["ratelimitd/budget/calls.py"]),
    # The memory store's counter table: a counter per slot, one probe per decision (twin:
    # backends/_counters_py.py, a dict).
    Extension("ratelimitd.backends._counters", ["ratelimitd/backends/_counters.pyx"]),
    # A store round started from C (no twin: the compiled decision alone hands a store its
    # fixed windows as C values; the twins take `Op`s).
    Extension("ratelimitd.backends._rounds", ["ratelimitd/backends/_rounds.pyx"]),
    # A Redis connection's round (written flushes, replies handed to their waiters), compiled
    # in Cython's pure-Python mode (types in rounds.pxd, which _resp.pyx cimports): the same
    # rounds.py runs uncompiled where this is not built.
    Extension("ratelimitd.backends.redis.rounds", ["ratelimitd/backends/redis/rounds.py"]),
    # The Redis counter path's codec leaves (twin: backends/redis/_resp_py.py).
    Extension("ratelimitd.backends.redis._resp", ["ratelimitd/backends/redis/_resp.pyx"]),
    # The native gRPC transport's HTTP/2 core (libnghttp2); optional, see above. `-l:` names
    # the runtime library's file: there is no libnghttp2.so link without the -dev package.
    Extension(
        "ratelimitd.transport._h2",
        ["ratelimitd/transport/_h2.pyx"],
        libraries=[":libnghttp2.so.14"],
    ),
]
OPTIONAL = set() if ctypes.util.find_library("nghttp2") else {"ratelimitd.transport._h2"}

modules = cythonize(
    extensions,
    language_level=3,
    compiler_directives={
        "boundscheck": False,
        "wraparound": False,
        "cdivision": True,
        "embedsignature": True,
    },
)
for module in modules:
    # Set after cythonize, which does not carry `optional` over to the modules it returns:
    # a failed compile of an optional module is then a warning and the build goes on.
    module.optional = module.name in OPTIONAL

setup(ext_modules=modules)
