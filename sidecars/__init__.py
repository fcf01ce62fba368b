"""HTTP sidecars that ship with ratelimitd (usage API, transit API)."""
