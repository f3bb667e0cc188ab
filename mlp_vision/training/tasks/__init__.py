""" What is trained: the tasks the driver (:mod:`mlp_vision.training.run.driver`) runs, and what each needs.

* image classification -- :mod:`.image_classification` (``ImageClassification``, with its epoch and evaluation
  loops, also validate.py's evaluation) and model creation / checkpoint loading (:mod:`.image_model`); its
  command is :mod:`mlp_vision.train`, the image data pipeline :mod:`mlp_vision.training.data`;
* masked / causal language modelling -- :mod:`.language_model` (``LMTask``), its text data and tokenizer
  (:mod:`.text_data`);
* text classification -- :mod:`.text_classification` (``ClassificationTask``), its initial weights
  (:mod:`.classifier_init`);
* the text trainer's flags (:mod:`.text_args`) and recipes, optimizer and schedule (:mod:`.text_recipes`); its
  command is :mod:`mlp_vision.train_text`.
"""
