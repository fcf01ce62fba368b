"""The one config error type."""


class ConfigError(ValueError):
    """A rejected config: `str(err)` is `<config name>: <message>` as the reference prints it."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message
