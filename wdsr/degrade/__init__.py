"""LR made on the fly (planned; DESIGN.md section 7): exact bicubic per patch (``lr="bicubic"``) and
real-world degradations (``wdsr.RealESRGANConfig``, ``wdsr.BSRGANConfig``, ``wdsr.Degrader``).

Its stages hang off the pipeline's patch stage; nothing lives here yet."""
