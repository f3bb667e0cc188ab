""" What is trained: the tasks the driver (:mod:`mlp_vision.training.run.driver`) runs.

* image classification: :mod:`.image_classification` (task, epoch and evaluation loops) and :mod:`.image_model`
  (model creation, checkpoint loading); command :mod:`mlp_vision.train`, data :mod:`mlp_vision.training.data`;
* masked / causal language modelling: :mod:`.language_model`, its data and tokenizer :mod:`.text_data`;
* text classification: :mod:`.text_classification`, its initial weights :mod:`.classifier_init`;
* the text trainer's flags (:mod:`.text_args`), recipes and shared task base (:mod:`.text_task`); command
  :mod:`mlp_vision.train_text`.
"""
