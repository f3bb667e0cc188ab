""" The trainers of the text models (``python -m mlp_vision.train_text`` / ``mlp-vision-text-train``), split by job:
the flags (:mod:`.args`), the recipes of ``configs/text/`` with the optimizer and schedule (:mod:`.recipes`), the
step loop every text task runs (:mod:`.steps`), language modelling (:mod:`.lm`, its data in :mod:`.data`),
sequence classification (:mod:`.classification`, its weights in :mod:`.classifier_init`) and the command
(:mod:`.cli`). ``mlp_vision.text`` (the models) imports nothing from here.
"""
