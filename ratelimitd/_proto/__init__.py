"""Protobuf modules generated from proto/ at install time by setup.py (see proto/README.md)."""
