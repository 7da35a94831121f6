"""The data path, one stage a module: plan -> read -> decode -> patches -> augment -> shuffle ->
batch -> handoff, with ``source`` (decoded pairs and the error policy), ``stream`` (one worker's
patches by position), ``elastic`` (an epoch re-planned over another world), ``stats`` and ``worker``
(the DataLoader worker's set-up). ``decode`` picks each sample's kind from the table in ``kinds``: one
module per kind of pair (``whole``, ``tiled``, ``clips``; LR made from HR: ``bicubic``, ``degraded``),
behind one interface (``patches.Pair``), each declaring its row (``sample``); ``checks`` holds what every
kind checks before a decode.

Imports run down: the face (``wdsr.dataset``, ``wdsr.loader``) -> here -> ``wdsr.store`` ->
``shardmaker``'s public modules. Nothing here reads the environment (``wdsr.env`` does).
"""
