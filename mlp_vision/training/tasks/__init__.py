""" The text trainer's tasks (image classification is :mod:`mlp_vision.train`, its model
:mod:`mlp_vision.training.image_model`).

* masked / causal language modelling: :mod:`.language_model`, its data and tokenizer :mod:`.text_data`;
* text classification: :mod:`.text_classification`, its initial weights :mod:`.classifier_init`;
* the text trainer's flags (:mod:`.text_args`), recipes and shared task base (:mod:`.text_task`); command
  :mod:`mlp_vision.train_text`.
"""
