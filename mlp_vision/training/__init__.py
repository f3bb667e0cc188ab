""" Training code, by job:

* :mod:`.run` -- the run infrastructure: the training run (resume, checkpoints, outputs, stop signals), the
  optimizer update (:mod:`.run.loop`), ``-c`` configs, logging, distributed setup; the text trainer's step driver
  (:mod:`.run.driver`);
* :mod:`.data` -- the image data pipeline (readers, datasets, loaders, hold-out splits);
* :mod:`.tasks` -- the image model (:mod:`.tasks.image_model`: creation, weight loading and the evaluation loop
  ``validate``). The text trainer is ``transformers.Trainer`` with the data and callbacks of :mod:`mlp_vision.text`.

The commands are one module each: :mod:`mlp_vision.train` (images; it reads as timm's train.py: ``main``,
``train_one_epoch``, ``validate``), :mod:`mlp_vision.train_text` (text),
:mod:`mlp_vision.validate`, :mod:`mlp_vision.benchmark`, :mod:`mlp_vision.visualize`,
:mod:`mlp_vision.text.fill_mask` and :mod:`mlp_vision.complexity`. Built from timm's library pieces (``timm.data``,
``timm.optim``, ``timm.scheduler``, ``timm.loss``, ``timm.utils``); the one error path of the commands is
:mod:`mlp_vision.errors`.
"""
