"""Process settings: one frozen :class:`Settings` in sections, built from the environment.

* ``sections.py``: the types (listeners, gRPC, Redis for each instance, memcache, stats,
  tracing, runtime layout, reload options, ...) with the reference's defaults;
* ``environment.py``: the package's only reader of ``os.environ``, one table per section,
  and :class:`Settings` itself (``settings_from_env``, which `backends.load_settings` calls
  with the backend registry);
* ``checks.py``: the cross-field checks, those of a backend as its declaration says
  (``backends.Capabilities``);
* ``goparse.py``: Go's value syntax (envconfig) and the typed reader with one-line errors;
* ``unsupported.py``: the reference's variables refused at start-up instead of ignored.

Importing this package reads nothing and imports nothing heavy.
"""

from . import sections
from .environment import (
    Settings,
    backend_type_from_env,
    extensions_disabled,
    reload_options_from_env,
    settings_from_env,
    worker_environ,
)
from .goparse import SettingsError, parse_go_bool, parse_go_duration, parse_go_int
from .sections import *  # noqa: F403 (the section types: sections.__all__)

__all__ = [
    *sections.__all__,
    "Settings",
    "SettingsError",
    "backend_type_from_env",
    "extensions_disabled",
    "parse_go_bool",
    "parse_go_duration",
    "parse_go_int",
    "reload_options_from_env",
    "settings_from_env",
    "worker_environ",
]
