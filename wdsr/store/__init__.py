"""Where shard bytes come from: ``remote`` (range reads that retry and resume), ``cache`` (the
node-local shard cache), ``decoded`` (the node-wide decoded-pair cache), ``urls`` (dataset URLs,
brace patterns, lists and mixes). Below the pipeline; uses only ``shardmaker``'s public modules."""
