""" Training code, by job:

* :mod:`.image_model` -- the image model of train.py / validate.py: creation, weight loading, the evaluation loop
  ``validate``, and where it runs (device and torchrun, AMP, ``torch.compile``);
* :mod:`.run_files` -- a training run's files and their safety (the run folder's identity and lock, resume,
  checkpoints with history, stop lines, results, summary.csv), as functions train.py calls in order;
* :mod:`.image_data` -- the image datasets (readers, decoding, labels, hold-out splits); :mod:`.image_loader` --
  the loaders (seeded augmentation, unusable images left out).

The text trainer is ``transformers.Trainer`` with the data and callbacks of :mod:`mlp_vision.text`.

The commands are one module each: :mod:`mlp_vision.train` (images; it reads as timm's train.py: ``main``,
``train_one_epoch``, ``validate``), :mod:`mlp_vision.train_text` (text),
:mod:`mlp_vision.validate`, :mod:`mlp_vision.benchmark`, :mod:`mlp_vision.visualize`,
:mod:`mlp_vision.text.fill_mask` and :mod:`mlp_vision.complexity`. Built from timm's library pieces (``timm.data``,
``timm.optim``, ``timm.scheduler``, ``timm.loss``, ``timm.utils``); the one error path of the commands is
:mod:`mlp_vision.errors`.
"""
