""" The image trainer's parts, by job: :mod:`.image_model` (the model of train.py / validate.py: creation, weight
loading, the evaluation loop ``validate``, device / AMP / ``torch.compile`` and their flags), :mod:`.run_files` (a
run's files and their safety, as functions train.py calls in order) and :mod:`.image_data` (datasets and loaders).
The commands are one module each (:mod:`mlp_vision.train` reads as timm's train.py); the text trainer is
``transformers.Trainer`` with the data and callbacks of :mod:`mlp_vision.text`.
"""
