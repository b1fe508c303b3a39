"""Online serving of trained vertical models (issue 41)."""
