""" Training code, by job:

* :mod:`.run` -- the run infrastructure every command uses: the one driver and its task interface, the training
  run (resume, checkpoints, outputs), the optimizer step loop, ``-c`` configs, logging, distributed setup;
* :mod:`.data` -- the image data pipeline (readers, datasets, loaders, hold-out splits);
* :mod:`.tasks` -- what is trained: image classification (the task with everything it builds; a task imports no
  command). The text trainer is ``transformers.Trainer`` with the data and callbacks of :mod:`mlp_vision.text`.

The commands are one module each (flags, their checks, the run built and driven with its task):
:mod:`mlp_vision.train` (images), :mod:`mlp_vision.train_text` (text),
:mod:`mlp_vision.validate`, :mod:`mlp_vision.benchmark`, :mod:`mlp_vision.visualize`,
:mod:`mlp_vision.text.fill_mask` and :mod:`mlp_vision.complexity`. Built from timm's library pieces (``timm.data``,
``timm.optim``, ``timm.scheduler``, ``timm.loss``, ``timm.utils``); the one error path of the commands is
:mod:`mlp_vision.errors`.
"""
