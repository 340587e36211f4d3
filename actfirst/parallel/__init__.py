"""Ranks on one node or several: the process group, FSDP2 sharding, weight sync into each rank's engine, the launcher
and the peer watch. Every function here is a plain function applied to a model or a context (torchtitan's habit);
the trainer (``actfirst.train.trainer``) calls them and otherwise does not know how many ranks there are."""
