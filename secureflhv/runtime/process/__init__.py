"""A party as a process: the runner, the launcher of a whole job on one machine, rendezvous, blame,
the party's executor, and events to the launcher."""
