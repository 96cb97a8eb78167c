"""A run folder and what a run writes into it: the folder's lock and checks (:mod:`.folder`), the
initial policy (:mod:`.initial`), the run's state and resume (:mod:`.state`), checkpoints, full
(:mod:`.checkpoint`) and sharded through DCP (:mod:`.sharded`), the config a run continues with
(:mod:`.run_config`), metrics (:mod:`.metrics`, :mod:`.trace_metrics`), rollout records
(:mod:`.rollout_log`), the divergence guard (:mod:`.divergence`) and the console lines
(:mod:`.console`)."""
