""" The run infrastructure the commands share: :mod:`.run_files` (resume, the run folder's identity and lock,
checkpoints, stops, results: functions the image trainer calls in order; the text trainer's
:class:`.training_run.TrainingRun` holds them), :mod:`.loop` (the optimizer update), :mod:`.checkpoint` (atomic
writes, safe loading, RNG capture), :mod:`.config` (``-c`` yaml),
:mod:`.summary`, :mod:`.log`, :mod:`.distributed`, :mod:`.compile`; :func:`.driver.drive` runs the text trainer's
steps (the image trainer, :mod:`mlp_vision.train`, runs its epochs itself).

Nothing here imports a task, a dataset or a text model (tests/test_structure.py checks it).
"""
