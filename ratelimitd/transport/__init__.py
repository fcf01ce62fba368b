"""Thin adapters between the network and `RateLimitService`: gRPC, HTTP `/json`, debug.

Nothing is imported here, so loading one transport never pulls in another's dependencies
(grpc, falcon, ...).
"""
