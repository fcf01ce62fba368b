"""Generated protobuf modules for the RLS v3 wire format (see proto/README.md; do not edit)."""
