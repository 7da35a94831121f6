"""Training frameworks (planned; DESIGN.md section 7): ``wdsr.integrations.basicsr`` (BasicSR's
``train_pipeline`` with ``datasets.train.type: WdsrDataset``) and ``wdsr.integrations.lightning``
(``WdsrDataModule``). They sit on top of the face (``wdsr``) as the tools do; nothing lives here yet."""
