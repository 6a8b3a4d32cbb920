"""Per-tenant option catalogs: declared questions, versioned like code, with the policy
(thresholds) and calibration (temperature) that turn probabilities into actions."""
