"""Where a party's batch work runs: the executor interface, the local process pool, Ray, and the lifeline that
takes worker processes down with their party. Below every other layer: it knows no cryptography and no wire."""
