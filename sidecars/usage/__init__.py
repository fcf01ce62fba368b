"""The account usage API: `GET /api/v2/user/usage` over ratelimitd's metered day buckets."""
