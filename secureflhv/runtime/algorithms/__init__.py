"""One module per algorithm of the job registry (:mod:`secureflhv.runtime.job.registry`).

Each holds the pydantic model of the algorithm's ``params``, an optional ``check(cfg, params)`` of the
whole job, and ``run(cfg, party, transport, params) -> metrics``, which runs one party's role: prepare
its data (:mod:`secureflhv.runtime.job.data_prep`), run the protocol's role class, save its artifacts.
"""
