"""Watching a job: the per-party status file, reports and metrics, and the job page."""
