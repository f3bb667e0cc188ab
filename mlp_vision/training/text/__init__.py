""" The trainers of the text models (``python -m mlp_vision.train_text`` / ``mlp-vision-text-train``), split by job:
the flags (:mod:`.args`), the recipes of ``configs/text/`` with the optimizer and schedule (:mod:`.recipes`),
language modelling (:mod:`.lm`, its data in :mod:`.data`), sequence classification (:mod:`.classification`, its
weights in :mod:`.classifier_init`) and the command (:mod:`.cli`); each task is a
:class:`mlp_vision.training.driver.StepTask`, run by the one driver. ``mlp_vision.text`` (the models) imports
nothing from here.
"""
