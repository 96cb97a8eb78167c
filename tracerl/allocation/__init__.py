"""Planning: rollout schemes, the driver-side session, outcome statistics, the TRACE planner and
its success predictor. Imports only :mod:`tracerl.core`, so a driver plans without model code."""
