"""What users run: ``cli`` (the ``wdsr`` command), ``bench`` (the harness behind ``wdsr bench``),
``preview`` (contact sheets), ``demo`` (``make demo``). Tools sit on top of the face (``wdsr``)."""
