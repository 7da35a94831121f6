"""The data path, one stage a module: plan -> read -> decode -> patches -> augment -> shuffle ->
batch -> handoff, with ``source`` (decoded pairs and the error policy), ``stream`` (one worker's
patches by position), ``elastic`` (an epoch re-planned over another world), ``stats`` and ``worker``
(the DataLoader worker's set-up). Clip (video) stages go beside the image stages.

Imports run down: the face (``wdsr.dataset``, ``wdsr.loader``) -> here -> ``wdsr.store`` ->
``shardmaker``'s public modules. Nothing here reads the environment (``wdsr.env`` does).
"""
