"""What every layer runs on: the event loop's helpers, TLS files that reload, the memory
allocator. Leaf modules: they import nothing else of ratelimitd but the settings."""
