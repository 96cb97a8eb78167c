"""Training over several processes with FSDP2: the launcher (:mod:`.launch`, torchrun), the process
group and sharding helpers (:mod:`.fsdp`), the sharded update (:mod:`.update`) and the trainer
whose rank 0 drives the Trainer while the other ranks serve (:mod:`.trainer`). It sits above
:mod:`tracerl.train`: the sharded update reuses the one-process update's pieces, and
``tracerl train --nproc N`` hands rank 0's hook to the Trainer."""
