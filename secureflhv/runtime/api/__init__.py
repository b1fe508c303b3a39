"""The Python API: build a job (:class:`Job`), run every party in this process (:func:`simulate`), read
the outcome (:class:`SimulationResult`), and write the same job for a deployment (:meth:`Job.write`).
Re-exported by the top-level package: ``secureflhv.Job``, ``secureflhv.simulate``."""
from .job_builder import Job
from .simulation_result import SimulationResult
from .simulation import SimulationError, simulate

__all__ = ["Job", "SimulationError", "SimulationResult", "simulate"]
