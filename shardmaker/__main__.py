import sys

from shardmaker.cli import main

sys.exit(main())
