"""Job module of ``algorithm: secureboost_horizontal`` (see :mod:`secureflhv.runtime.secureboost_job`)."""
from .secureboost_job import SecureBoostJobParams, job_params, run_job

__all__ = ["SecureBoostJobParams", "job_params", "run_job"]
