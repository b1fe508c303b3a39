"""Research partitioners (NIID-Bench and the survey's non-IID settings): who gets which rows or columns, FCUBE,
partition statistics, pictures, shard files and the ``secureflhv partition`` command."""
