""" What is trained.

* image classification: :mod:`.image_model` (model creation, checkpoint loading, the evaluation loop); the epochs
  are :mod:`mlp_vision.train`'s own (timm's shape), data :mod:`mlp_vision.training.data`.

The text trainer (:mod:`mlp_vision.train_text`) runs on ``transformers.Trainer``; its data and callbacks live beside
the text models, in :mod:`mlp_vision.text`.
"""
