""" Safe loading of checkpoint files (:mod:`.checkpoint`). The run's own files are
:mod:`mlp_vision.training.run_files`, the commands' output files :mod:`mlp_vision.outputs`. """
