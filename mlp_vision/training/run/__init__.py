""" The run infrastructure every command shares: one run of a trainer from its arguments to its outputs.

* :mod:`.driver` -- :func:`~.driver.drive`, the one driver, and the task interface it calls
  (:class:`~.driver.TrainingTask`; :class:`~.driver.StepTask` for step-based tasks);
* :mod:`.training_run` -- :class:`~.training_run.TrainingRun`: resume, the run folder, checkpoints' payload,
  AMP and the optimizer step, LR schedules, NaN and signal stops, results;
* :mod:`.loop` -- the optimizer update every trainer advances through (gradient accumulation, one sync per update);
* :mod:`.checkpoint` (atomic writes, safe loading, RNG capture), :mod:`.folder` (a run folder's identity and
  lock), :mod:`.config` (``-c`` yaml and the arguments saved as given), :mod:`.summary` (summary.csv, curves),
  :mod:`.log`, :mod:`.distributed` (devices, torchrun), :mod:`.compile` (``--torchcompile``).

Nothing here imports a task, a dataset or a text model (tests/test_structure.py checks it).
"""
