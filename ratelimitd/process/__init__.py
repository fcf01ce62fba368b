"""The process: the command line, the daemon that composes the layers, its workers, the
config reloader and the logs."""
