"""Training frameworks, on top of the face (``wdsr``) as the tools are (docs/integrations.md):
``wdsr.integrations.basicsr`` runs BasicSR's own ``train_pipeline`` with ``datasets.train.type:
WdsrDataset`` (``python -m wdsr.integrations.basicsr -opt train.yml``); ``wdsr.integrations.lightning``
has ``WdsrDataModule`` and the ``WdsrStats`` callback. Neither framework is a dependency of wdsr:
each module imports its own (``lightning`` is in the ``dev`` extra; basicsr is installed ``--no-deps``)."""
