"""tether.tune: search the schedule knobs of a model's kernels on a pool of devices (``tether tune``, docs/tune.md).

space.py (config spaces), log.py (the JSON-lines log, resume, best configs), tasks.py (a model's distinct kernels),
measure.py (build workers, device runners over the tracker), cost_model.py, search.py (the explorer and the tuning
loop), report.py (HTML tuning curves). Nothing is imported here: the tasks are the tunable tasks of the kernel
plan (``tether.graph.plan``) that the model build compiles; ``tether.build_graph(tuning_log=)`` reads a log with
``log.best_configs``.
"""
