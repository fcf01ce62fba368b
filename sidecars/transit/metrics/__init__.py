"""Transit metrics: operator records (validations, rides, complaints) in, `/v2/metrics/*` out."""
