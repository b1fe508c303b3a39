"""What a job is: the job-file schema, loading and validation, the algorithm registry, preflight checks,
data preparation and ready-made demo jobs."""
