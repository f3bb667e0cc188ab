""" What is trained.

* image classification: :mod:`.image_model` (model creation, checkpoint loading, the evaluation loop); the epochs
  are :mod:`mlp_vision.train`'s own (timm's shape), data :mod:`mlp_vision.training.data`;
* masked / causal language modelling: :mod:`.language_model`, its data and tokenizer :mod:`.text_data`;
* text classification: :mod:`.text_classification`, its initial weights :mod:`.classifier_init`;
* the text trainer's flags (:mod:`.text_args`), recipes and shared task base (:mod:`.text_task`); command
  :mod:`mlp_vision.train_text`.
"""
