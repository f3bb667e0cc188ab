""" What is trained: the tasks the driver (:mod:`mlp_vision.training.run.driver`) runs.

* image classification: :mod:`.image_classification` (task, epoch and evaluation loops) and :mod:`.image_model`
  (model creation, checkpoint loading); command :mod:`mlp_vision.train`, data :mod:`mlp_vision.training.data`.

The text trainer (:mod:`mlp_vision.train_text`) runs on ``transformers.Trainer``; its data and callbacks live beside
the text models, in :mod:`mlp_vision.text`.
"""
