"""The gateway's use cases, between the routes (which call only these) and the domain:
`decide` (a decision from the caller's request to its record) and `records` (outcomes,
reading records back, calibration drift)."""
