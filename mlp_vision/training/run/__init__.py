""" The run infrastructure of the commands: :mod:`.run_files` (the run folder's identity and lock, resume,
checkpoints, stops, results: functions the image trainer calls in order), :mod:`.loop` (the optimizer update),
:mod:`.checkpoint` (atomic writes, safe loading, RNG capture), :mod:`.config` (``-c`` yaml), :mod:`.summary`,
:mod:`.log`, :mod:`.distributed`, :mod:`.compile`.

Nothing here imports a task, a dataset or a text model (tests/test_structure.py checks it).
"""
